# C types for _codec_py.py, compiled as fxengine.journal._codec_c (see setup.py).
# msgpack and json do the work; compiling removes the Python-level call and check overhead.
cimport cython

cdef bytes _MAGIC
cdef bytes _HEADER
cdef object _json_encoder

cpdef bytes encode_record(str kind, object body)

@cython.locals(version=int, value=object, kind=object, body=object)
cpdef tuple decode_record(object data)

cpdef bytes encode_line(object obj)

cdef object _invalid(str message, bytes data)
