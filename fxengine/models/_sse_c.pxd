# C types for _sse_py.py, compiled as fxengine.models._sse_c (see setup.py).
# The hot loop is ChatStreamDecoder._lines -> _dispatch -> _chunk -> _delta: typed
# attributes and locals keep it in C apart from the JSON parse and the dict look-ups.
cimport cython

cdef object _loads
cdef object _std_loads
cdef bytes _BOM


cdef class ToolCallOut:
    cdef public str id
    cdef public str name
    cdef public str arguments


cdef class StreamOutcome:
    cdef public object finish_reason
    cdef public list tool_calls
    cdef public object usage
    cdef public bint done
    cdef public object error
    cdef public object model
    cdef public list events
    cdef public Py_ssize_t malformed_chunks


cdef class _ToolCallBuilder:
    cdef public object index
    cdef public str id
    cdef public str name
    cdef public list pieces
    cdef public bint announced


cdef class ChatStreamDecoder:
    cdef bytes _buf
    cdef object _event
    cdef bint _pending_lf
    cdef bint _started
    cdef dict _calls
    cdef object _outcome
    cdef public object finish_reason
    cdef public object usage
    cdef public bint done
    cdef public object error
    cdef public object model
    cdef public Py_ssize_t malformed_chunks

    @cython.locals(events=list, buf=bytes)
    cpdef list feed(self, object data)

    @cython.locals(pos=Py_ssize_t, end=Py_ssize_t, nl=Py_ssize_t, start=Py_ssize_t, payload=bytes)
    cdef _lines(self, bytes buf, list events)

    cdef _data_line(self, bytes line)

    cdef _dispatch(self, bytes payload, list events)

    @cython.locals(choices=object, choice=object, delta=object, finish=object, usage=object)
    cdef _chunk(self, dict obj, list events)

    @cython.locals(text=object, calls=object)
    cdef _delta(self, dict delta, list events)

    @cython.locals(builder=_ToolCallBuilder)
    cdef _tool_call(self, dict call, list events)

    @cython.locals(events=list, calls=list, builder=_ToolCallBuilder)
    cpdef StreamOutcome finish(self)


@cython.locals(out=dict, details=object, value=object)
cdef dict _usage(dict usage)
