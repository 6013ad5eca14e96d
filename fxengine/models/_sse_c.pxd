# C types for _sse_py.py, compiled as fxengine.models._sse_c (see setup.py).
# The hot loop is ChatStreamDecoder._lines -> _scanned -> _ChunkScan.scan: byte loops
# over a typed `bytes`, all in C, with no JSON objects built; chunks the scan leaves go
# _dispatch -> _parse (orjson) -> _chunk -> _delta, typed as far as the dicts allow.
cimport cython

cdef object _loads
cdef object _std_loads
cdef bint _scan_chunks
cdef bytes _BOM
cdef Py_ssize_t _MAX_NESTING


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


cdef class _ChunkScan:
    cdef readonly object model
    cdef readonly object reasoning
    cdef readonly object content
    cdef readonly object finish
    cdef bint _want_model
    cdef Py_ssize_t model_a, model_b, finish_a, finish_b, content_a, content_b, rc_a, rc_b, r_a, r_b

    cdef inline void _reset(self) noexcept

    @cython.locals(i=Py_ssize_t, n=Py_ssize_t, model=object, reasoning=object, content=object, finish=object)
    cpdef bint scan(self, bytes s, Py_ssize_t start, Py_ssize_t end, bint want_model) except -1

    @cython.locals(seen=int, key=Py_ssize_t, size=Py_ssize_t, c=cython.uchar)
    cdef Py_ssize_t _top(self, bytes s, Py_ssize_t i, Py_ssize_t n)

    cdef Py_ssize_t _choices(self, bytes s, Py_ssize_t i, Py_ssize_t n)

    @cython.locals(seen=int, key=Py_ssize_t, size=Py_ssize_t, c=cython.uchar)
    cdef Py_ssize_t _choice(self, bytes s, Py_ssize_t i, Py_ssize_t n)

    @cython.locals(seen=int, key=Py_ssize_t, size=Py_ssize_t, field=int, a=Py_ssize_t)
    cdef Py_ssize_t _delta(self, bytes s, Py_ssize_t i, Py_ssize_t n)


cdef class ChatStreamDecoder:
    cdef bytes _buf
    cdef object _event
    cdef bint _pending_lf
    cdef bint _started
    cdef dict _calls
    cdef _ChunkScan _scan
    cdef object _outcome
    cdef public object finish_reason
    cdef public object usage
    cdef public bint done
    cdef public object error
    cdef public object model
    cdef public Py_ssize_t malformed_chunks
    cdef bint _refused

    @cython.locals(events=list, buf=bytes)
    cpdef list feed(self, object data)

    @cython.locals(pos=Py_ssize_t, end=Py_ssize_t, nl=Py_ssize_t, start=Py_ssize_t, payload=bytes)
    cdef _lines(self, bytes buf, list events)

    cdef _data_line(self, bytes line)

    cdef _dispatch(self, bytes payload, list events)

    @cython.locals(scan=_ChunkScan)
    cdef bint _scanned(self, bytes buf, Py_ssize_t start, Py_ssize_t end, list events) except -1

    @cython.locals(choices=object, choice=object, delta=object, finish=object, usage=object)
    cdef _chunk(self, dict obj, list events)

    @cython.locals(text=object, calls=object)
    cdef _delta(self, dict delta, list events)

    @cython.locals(kind=object, text=object)
    cdef _parts(self, list parts, list events)

    @cython.locals(builder=_ToolCallBuilder)
    cdef _tool_call(self, dict call, list events)

    @cython.locals(events=list, calls=list, builder=_ToolCallBuilder)
    cpdef StreamOutcome finish(self)


@cython.locals(index=object)
cdef object _first_choice(list choices)

cdef _reasoning(object value, list events)

cdef object _parse(bytes payload)

@cython.locals(usage=object, error=object, choices=object, choice=object, delta=object, calls=object, call=object)
cdef bint _may_differ(dict obj) except -1

@cython.locals(kind=object, item=object)
cdef bint _holds_float(object value) except -1

@cython.locals(depth=Py_ssize_t, deepest=Py_ssize_t, in_string=bint, i=Py_ssize_t, n=Py_ssize_t, c=cython.uchar)
cdef Py_ssize_t _nesting(bytes s)

@cython.locals(out=dict, details=object, value=object)
cdef dict _usage(dict usage)


# The chunk scan: byte loops over a typed `bytes`, all in C.
cdef Py_ssize_t _MAX_DEPTH
cdef int _KEY, _SKIP, _KEEP
cdef dict _ESCAPED
cdef bytes _PLAIN

@cython.locals(c=cython.uchar)
cdef Py_ssize_t _ws(bytes s, Py_ssize_t i, Py_ssize_t n) noexcept

cdef Py_ssize_t _colon(bytes s, Py_ssize_t i, Py_ssize_t n) noexcept

@cython.locals(start=Py_ssize_t, high=bint, c=cython.uchar, j=Py_ssize_t)
cdef Py_ssize_t _string(bytes s, Py_ssize_t i, Py_ssize_t n, int kind)

@cython.locals(c=cython.uchar)
cdef Py_ssize_t _number(bytes s, Py_ssize_t i, Py_ssize_t n) noexcept

@cython.locals(c=cython.uchar, close=cython.uchar)
cdef Py_ssize_t _value(bytes s, Py_ssize_t i, Py_ssize_t n, int depth)

@cython.locals(c=cython.uchar)
cdef Py_ssize_t _next_member(bytes s, Py_ssize_t i, Py_ssize_t n) noexcept

cdef Py_ssize_t _first_member(bytes s, Py_ssize_t i, Py_ssize_t n) noexcept

cdef Py_ssize_t _null(bytes s, Py_ssize_t i, Py_ssize_t n)

@cython.locals(j=Py_ssize_t, c=cython.uchar, code=Py_ssize_t, low=Py_ssize_t, parts=list)
cdef str _text(bytes s, Py_ssize_t a, Py_ssize_t b)
