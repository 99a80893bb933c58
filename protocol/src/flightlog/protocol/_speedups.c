/* flightlog.protocol._speedups: the daemon's per-record path in C, as a fast ACCEPT path.

Theory of operation
-------------------
Every function here answers "yes, this is certainly what the Python code would accept,
and here is exactly what it would make of it" or "not sure".  It never refuses
anything: on any doubt (a frame it does not handle, an escape it does not fully check,
a number near a reader's bounds, nesting near the limit, a size near a limit) it stops
and the caller hands the input to the Python path, which stays the single source of
truth for refusals and their typed errors.  So C accepting implies Python accepting,
with byte-identical output; tests/protocol/test_speedups.py checks that on random and
hostile input.

* json_ok: one pass over JSON bytes, building nothing: the syntax, the UTF-8 of
  strings, escapes (no surrogates), nesting up to a bound, and numbers whose digits
  prove a reader reads them back.  Only space and tab count as whitespace (a raw
  newline would split a line).
* take_records: walks the complete frames buffered in a FrameDecoder and takes every
  one that is a RecordEvent in msgspec's own layout for a session the connection
  writes, with its open run, an agent fact type, a record time and data that is a JSON
  object json_ok accepts, within the sizes.  What it takes comes out as one
  RecordLines per stretch of one session: for each record, the part of its line after
  the seq, behind its length.  It stops at the first frame it does not take.
* append_lines: the session actor's side: each record's line is the session's head,
  the seq, then that tail; one call appends a whole stretch.

Every read is bounds-checked against the end of its buffer; nothing recurses.  No
Python code runs during a call, so the decoder's buffer cannot move under it.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The deepest nesting json_ok follows; deeper data goes to the Python path.  Far below
   MAX_NESTING (256) and the codec's 200: msgspec's own bound is the recursion limit
   from where it is called, and a caller deep in its stack (up to the limit less this)
   must still get the same verdict from C as from msgspec. */
#define JSON_MAX_DEPTH 64
/* Digits before or after a number's point that json_ok accepts (with an exponent of at
   most two digits: 10**200 * 10**99 is within the double range). */
#define NUMBER_MAX_DIGITS 200
/* Data longer than this is checked without holding the GIL. */
#define RELEASE_GIL_FROM 65536

typedef const unsigned char *cursor;

/* ------------------------------------------------------------------ JSON */

static inline cursor
skip_ws(cursor p, cursor end)
{
    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }
    return p;
}

/* One UTF-8 sequence starting at a byte >= 0x80: its end, or NULL. */
static inline cursor
utf8_sequence(cursor p, cursor end)
{
    unsigned int c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80) {
            return NULL;
        }
        return p + 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) {
            return NULL;
        }
        if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F)) {
            return NULL; /* overlong, or a surrogate */
        }
        return p + 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80) {
            return NULL;
        }
        if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F)) {
            return NULL; /* overlong, or past U+10FFFF */
        }
        return p + 4;
    }
    return NULL;
}

static inline int
hex_value(unsigned int c)
{
    if (c >= '0' && c <= '9') {
        return (int)(c - '0');
    }
    if (c >= 'a' && c <= 'f') {
        return (int)(c - 'a' + 10);
    }
    if (c >= 'A' && c <= 'F') {
        return (int)(c - 'A' + 10);
    }
    return -1;
}

#ifndef __SSE2__
#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)

/* Whether any of the 8 bytes in v needs a look: a quote, a backslash, a control
   character or a byte >= 0x80. */
static inline int
special_in(uint64_t v)
{
    uint64_t quote = v ^ (ONES * '"');
    uint64_t backslash = v ^ (ONES * '\\');
    uint64_t found = ((quote - ONES) & ~quote) | ((backslash - ONES) & ~backslash) |
                     ((v - ONES * 0x20) & ~v) | v;
    return (found & HIGHS) != 0;
}
#endif

/* The rest of a string whose opening quote is before p: the end of its closing
   quote, or NULL. */
static cursor
scan_string(cursor p, cursor end)
{
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
#endif
    for (;;) {
#ifdef __SSE2__
        /* 16 bytes at a time, straight to the first that needs a look: as signed
           bytes, those >= 0x80 are below 0x20 too. */
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i found = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmplt_epi8(v, space));
            int mask = _mm_movemask_epi8(found);
            if (mask != 0) {
                p += __builtin_ctz((unsigned int)mask);
                break;
            }
            p += 16;
        }
#else
        while (end - p >= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            if (special_in(v)) {
                break;
            }
            p += 8;
        }
#endif
        if (p >= end) {
            return NULL;
        }
        unsigned int c = *p;
        if (c == '"') {
            return p + 1;
        }
        if (c == '\\') {
            if (end - p < 2) {
                return NULL;
            }
            switch (p[1]) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                p += 2;
                continue;
            case 'u': {
                if (end - p < 6) {
                    return NULL;
                }
                int code = 0;
                for (int i = 2; i < 6; i++) {
                    int nibble = hex_value(p[i]);
                    if (nibble < 0) {
                        return NULL;
                    }
                    code = code * 16 + nibble;
                }
                if (code >= 0xD800 && code <= 0xDFFF) {
                    return NULL; /* surrogates: left to the Python path */
                }
                p += 6;
                continue;
            }
            default:
                return NULL;
            }
        }
        if (c < 0x20) {
            return NULL;
        }
        if (c >= 0x80) {
            p = utf8_sequence(p, end);
            if (p == NULL) {
                return NULL;
            }
            continue;
        }
        p++;
    }
}

static inline cursor
scan_digits(cursor p, cursor end, Py_ssize_t *count)
{
    cursor start = p;
    while (p < end && *p >= '0' && *p <= '9') {
        p++;
    }
    *count = p - start;
    return p;
}

/* A number starting at p: its end, or NULL (not one, or not certainly in range). */
static cursor
scan_number(cursor p, cursor end)
{
    Py_ssize_t digits;
    if (p < end && *p == '-') {
        p++;
    }
    if (p >= end) {
        return NULL;
    }
    if (*p == '0') {
        p++;
    }
    else if (*p >= '1' && *p <= '9') {
        p = scan_digits(p, end, &digits);
        if (digits > NUMBER_MAX_DIGITS) {
            return NULL;
        }
    }
    else {
        return NULL;
    }
    if (p < end && *p == '.') {
        p = scan_digits(p + 1, end, &digits);
        if (digits == 0 || digits > NUMBER_MAX_DIGITS) {
            return NULL;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            p++;
        }
        p = scan_digits(p, end, &digits);
        if (digits == 0 || digits > 2) {
            return NULL;
        }
    }
    return p;
}

/* Whether data is certainly one JSON value a reader reads back, nested at most
   max_depth deep; 0 means "not sure". */
static int
json_ok(cursor p, Py_ssize_t size, int max_depth)
{
    cursor end = p + size;
    unsigned char stack[JSON_MAX_DEPTH];
    int depth = 0;

    if (max_depth > JSON_MAX_DEPTH) {
        max_depth = JSON_MAX_DEPTH;
    }
    p = skip_ws(p, end);
value:
    if (p >= end) {
        return 0;
    }
    switch (*p) {
    case '{':
        if (depth >= max_depth) {
            return 0;
        }
        stack[depth++] = '{';
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            p++;
            depth--;
            goto after_value;
        }
        goto key;
    case '[':
        if (depth >= max_depth) {
            return 0;
        }
        stack[depth++] = '[';
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            p++;
            depth--;
            goto after_value;
        }
        goto value;
    case '"':
        p = scan_string(p + 1, end);
        break;
    case 't':
        p = (end - p >= 4 && memcmp(p, "true", 4) == 0) ? p + 4 : NULL;
        break;
    case 'f':
        p = (end - p >= 5 && memcmp(p, "false", 5) == 0) ? p + 5 : NULL;
        break;
    case 'n':
        p = (end - p >= 4 && memcmp(p, "null", 4) == 0) ? p + 4 : NULL;
        break;
    default:
        p = scan_number(p, end);
        break;
    }
    if (p == NULL) {
        return 0;
    }
after_value:
    p = skip_ws(p, end);
    if (depth == 0) {
        return p == end;
    }
    if (p >= end) {
        return 0;
    }
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        if (stack[depth - 1] == '{') {
            goto key;
        }
        goto value;
    }
    if ((*p == '}' && stack[depth - 1] == '{') || (*p == ']' && stack[depth - 1] == '[')) {
        p++;
        depth--;
        goto after_value;
    }
    return 0;
key:
    if (p >= end || *p != '"') {
        return 0;
    }
    p = scan_string(p + 1, end);
    if (p == NULL) {
        return 0;
    }
    p = skip_ws(p, end);
    if (p >= end || *p != ':') {
        return 0;
    }
    p = skip_ws(p + 1, end);
    goto value;
}

/* ------------------------------------------------------------------ time */

static inline int
two_digits(cursor s, int *out)
{
    if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9') {
        return 0;
    }
    *out = (s[0] - '0') * 10 + (s[1] - '0');
    return 1;
}

/* Whether s is certainly a record time (RFC 3339 UTC with Z, a real date in the years
   0001 to 9999: year 0000 is refused by the Python rule, so never accepted here). */
static int
time_ok(cursor s, Py_ssize_t n)
{
    int century, year2, month, day, hour, minute, second;
    if (n < 20 || n > 30 || n == 21) {
        return 0;
    }
    if (s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
        s[n - 1] != 'Z') {
        return 0;
    }
    if (!two_digits(s, &century) || !two_digits(s + 2, &year2) || !two_digits(s + 5, &month) ||
        !two_digits(s + 8, &day) || !two_digits(s + 11, &hour) ||
        !two_digits(s + 14, &minute) || !two_digits(s + 17, &second)) {
        return 0;
    }
    if (n > 20) {
        if (s[19] != '.') {
            return 0;
        }
        for (Py_ssize_t i = 20; i < n - 1; i++) {
            if (s[i] < '0' || s[i] > '9') {
                return 0;
            }
        }
    }
    int year = century * 100 + year2;
    if (year < 1 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 ||
        minute > 59 || second > 59) {
        return 0;
    }
    if (day > 28) {
        static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        int last = days[month - 1];
        if (month == 2 && year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)) {
            last = 29;
        }
        if (day > last) {
            return 0;
        }
    }
    return 1;
}

/* Whether a string's JSON encoding (msgspec's) is itself between two quotes. */
static int
plain_ascii(const char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7E || c == '"' || c == '\\') {
            return 0;
        }
    }
    return 1;
}

/* --------------------------------------------------------------- msgpack */

typedef struct {
    cursor p;
    cursor end;
} reader;

/* A big-endian length of `width` bytes (1, 2 or 4), as msgpack writes str and bin. */
static inline int
read_length(reader *r, int width, size_t *length)
{
    if (r->end - r->p < width) {
        return 0;
    }
    size_t value = 0;
    for (int i = 0; i < width; i++) {
        value = (value << 8) | r->p[i];
    }
    r->p += width;
    *length = value;
    return 1;
}

/* The `length` bytes at the reader, if the buffer holds them all. */
static inline int
take_bytes(reader *r, size_t length, cursor *s, Py_ssize_t *n)
{
    if ((size_t)(r->end - r->p) < length) {
        return 0;
    }
    *s = r->p;
    *n = (Py_ssize_t)length;
    r->p += length;
    return 1;
}

static int
read_str(reader *r, cursor *s, Py_ssize_t *n)
{
    if (r->p >= r->end) {
        return 0;
    }
    unsigned int c = *r->p++;
    size_t length;
    if (c >= 0xA0 && c <= 0xBF) {
        length = c & 0x1F;
    }
    else if (!(c >= 0xD9 && c <= 0xDB) || !read_length(r, 1 << (c - 0xD9), &length)) {
        return 0; /* str 8, 16, 32: 0xD9, 0xDA, 0xDB */
    }
    return take_bytes(r, length, s, n);
}

static int
read_bin(reader *r, cursor *s, Py_ssize_t *n)
{
    if (r->p >= r->end) {
        return 0;
    }
    unsigned int c = *r->p++;
    size_t length;
    if (!(c >= 0xC4 && c <= 0xC6) || !read_length(r, 1 << (c - 0xC4), &length)) {
        return 0; /* bin 8, 16, 32: 0xC4, 0xC5, 0xC6 */
    }
    return take_bytes(r, length, s, n);
}

/* A key spelled exactly as msgspec writes it: a fixstr. */
static inline int
read_key(reader *r, const char *key, Py_ssize_t n)
{
    if (r->end - r->p < 1 + n || *r->p != (0xA0 | n) || memcmp(r->p + 1, key, (size_t)n) != 0) {
        return 0;
    }
    r->p += 1 + n;
    return 1;
}

#define KEY(r, text) read_key((r), (text), (Py_ssize_t)(sizeof(text) - 1))

typedef struct {
    cursor session_id, run_id, event_type, time, data;
    Py_ssize_t session_id_n, run_id_n, event_type_n, time_n, data_n;
} record_frame;

/* Whether the frame body is a RecordEvent in msgspec's layout (the tag, then the fields
   in their order, nothing after). */
static int
read_record(cursor body, Py_ssize_t length, record_frame *f)
{
    reader r = {body, body + length};
    cursor tag;
    Py_ssize_t tag_n;
    if (length < 1 || *r.p++ != 0x86) {
        return 0;
    }
    if (!KEY(&r, "type") || !read_str(&r, &tag, &tag_n) || tag_n != 6 ||
        memcmp(tag, "record", 6) != 0) {
        return 0;
    }
    if (!KEY(&r, "session_id") || !read_str(&r, &f->session_id, &f->session_id_n)) {
        return 0;
    }
    if (!KEY(&r, "run_id") || !read_str(&r, &f->run_id, &f->run_id_n)) {
        return 0;
    }
    if (!KEY(&r, "event_type") || !read_str(&r, &f->event_type, &f->event_type_n)) {
        return 0;
    }
    if (!KEY(&r, "time") || !read_str(&r, &f->time, &f->time_n)) {
        return 0;
    }
    if (!KEY(&r, "data") || !read_bin(&r, &f->data, &f->data_n)) {
        return 0;
    }
    return r.p == r.end;
}

/* ------------------------------------------------------------- the stretch */

#define TAIL_LENGTH 4 /* each tail is behind its length, a native uint32 */

typedef struct {
    PyObject *session_id; /* str */
    PyObject *run_id;     /* str */
    PyObject *tails;      /* bytearray */
    Py_ssize_t used;
    Py_ssize_t count;
    Py_ssize_t size;
} stretch;

static void
stretch_clear(stretch *st)
{
    Py_CLEAR(st->session_id);
    Py_CLEAR(st->run_id);
    Py_CLEAR(st->tails);
    st->used = st->count = st->size = 0;
}

/* Append st as a RecordLines to out and start afresh; -1 on error. */
static int
stretch_flush(stretch *st, PyObject *make, PyObject *out)
{
    if (st->count == 0) {
        stretch_clear(st);
        return 0;
    }
    if (PyByteArray_Resize(st->tails, st->used) < 0) {
        return -1;
    }
    PyObject *lines = PyObject_CallFunction(make, "OOnnO", st->session_id, st->run_id,
                                            st->count, st->size, st->tails);
    if (lines == NULL) {
        return -1;
    }
    int failed = PyList_Append(out, lines);
    Py_DECREF(lines);
    stretch_clear(st);
    return failed;
}

static int
stretch_reserve(stretch *st, Py_ssize_t more)
{
    Py_ssize_t have = PyByteArray_GET_SIZE(st->tails);
    if (st->used + more <= have) {
        return 0;
    }
    Py_ssize_t want = have * 2;
    if (want < st->used + more) {
        want = st->used + more;
    }
    return PyByteArray_Resize(st->tails, want);
}

static const char TYPE_PART[] = ",\"type\":\"";
static const char TIME_PART[] = "\",\"time\":\"";
static const char RUN_PART[] = "\",\"run_id\":\"";
static const char DATA_PART[] = "\",\"data\":";
#define LEN(text) ((Py_ssize_t)(sizeof(text) - 1))

static int
stretch_add(stretch *st, const record_frame *f)
{
    Py_ssize_t tail = LEN(TYPE_PART) + f->event_type_n + LEN(TIME_PART) + f->time_n +
                      LEN(RUN_PART) + f->run_id_n + LEN(DATA_PART) + f->data_n + 2;
    if (stretch_reserve(st, TAIL_LENGTH + tail) < 0) {
        return -1;
    }
    char *out = PyByteArray_AS_STRING(st->tails) + st->used;
    uint32_t length = (uint32_t)tail;
    memcpy(out, &length, TAIL_LENGTH);
    out += TAIL_LENGTH;
#define PUT(source, n)                     \
    do {                                   \
        memcpy(out, (source), (size_t)(n)); \
        out += (n);                        \
    } while (0)
    PUT(TYPE_PART, LEN(TYPE_PART));
    PUT(f->event_type, f->event_type_n);
    PUT(TIME_PART, LEN(TIME_PART));
    PUT(f->time, f->time_n);
    PUT(RUN_PART, LEN(RUN_PART));
    PUT(f->run_id, f->run_id_n);
    PUT(DATA_PART, LEN(DATA_PART));
    PUT(f->data, f->data_n);
    PUT("}\n", 2);
#undef PUT
    st->used += TAIL_LENGTH + tail;
    st->count += 1;
    st->size += f->data_n;
    return 0;
}

/* ------------------------------------------------------------ the module */

typedef struct {
    PyObject *str_state;
    PyObject *str_run_id;
} module_state;

static inline module_state *
get_state(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

PyDoc_STRVAR(check_json_doc,
             "check_json(data, limit, /)\n--\n\n"
             "Whether data is certainly one JSON value a reader reads back, nested at most\n"
             "limit deep, on one line.  False means not sure: ask the Python check.");

static PyObject *
speedups_check_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_json(data, limit)");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0])) {
        Py_RETURN_FALSE; /* anything but bytes: the Python path */
    }
    long limit = PyLong_AsLong(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int max_depth = limit < 0 ? 0 : (limit > JSON_MAX_DEPTH ? JSON_MAX_DEPTH : (int)limit);
    cursor data = (cursor)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    int ok;
    if (size >= RELEASE_GIL_FROM) {
        /* bytes are immutable and args[0] is held by the caller. */
        Py_BEGIN_ALLOW_THREADS ok = json_ok(data, size, max_depth);
        Py_END_ALLOW_THREADS
    }
    else {
        ok = json_ok(data, size, max_depth);
    }
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(is_time_doc,
             "is_time(text, /)\n--\n\n"
             "Whether text is certainly a record time; False means not sure.");

static PyObject *
speedups_is_time(PyObject *module, PyObject *text)
{
    (void)module;
    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text)) {
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(
        time_ok((cursor)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text)));
}

PyDoc_STRVAR(take_records_doc,
             "take_records(buf, pos, max_frame_size, sessions, run_open, facts, max_data, "
             "limit, make, /)\n--\n\n"
             "Take the record frames of buf from pos on that certainly pass the rules:\n"
             "(the position after the last taken, a list of make(session_id, run_id,\n"
             "count, size, tails) per stretch of one session).");

static PyObject *
speedups_take_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *ms = get_state(module);
    if (nargs != 9 || !PyByteArray_Check(args[0]) || !PyDict_Check(args[3]) ||
        !PyAnySet_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "take_records: bad arguments");
        return NULL;
    }
    PyObject *buf = args[0], *sessions = args[3], *run_open = args[4], *facts = args[5];
    PyObject *make = args[8];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_frame = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_data = PyLong_AsSsize_t(args[6]);
    long limit = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    int max_depth = limit < 0 ? 0 : (limit > JSON_MAX_DEPTH ? JSON_MAX_DEPTH : (int)limit);
    Py_ssize_t size = PyByteArray_GET_SIZE(buf);
    if (pos < 0 || pos > size) {
        PyErr_SetString(PyExc_ValueError, "take_records: pos out of the buffer");
        return NULL;
    }
    cursor base = (cursor)PyByteArray_AS_STRING(buf);
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    stretch st = {NULL, NULL, NULL, 0, 0, 0};
    /* The session of the stretch, as the frames spell it. */
    cursor sid = NULL;
    Py_ssize_t sid_n = 0;
    /* The last event type found among the facts. */
    char fact[64];
    Py_ssize_t fact_n = -1;

    for (;;) {
        if (size - pos < 4) {
            break;
        }
        cursor head = base + pos;
        size_t length = ((size_t)head[0] << 24) | ((size_t)head[1] << 16) |
                        ((size_t)head[2] << 8) | head[3];
        if (max_frame < 0 || length > (size_t)max_frame || length > (size_t)(size - pos - 4)) {
            break;
        }
        record_frame f;
        if (!read_record(head + 4, (Py_ssize_t)length, &f)) {
            break;
        }
        if (f.data_n > max_data || f.data_n < 1 || f.data[0] != '{' ||
            !time_ok(f.time, f.time_n)) {
            break;
        }
        if (sid == NULL || f.session_id_n != sid_n ||
            memcmp(f.session_id, sid, (size_t)sid_n) != 0) {
            /* Another session: look up its rules. */
            PyObject *session_id = PyUnicode_DecodeUTF8((const char *)f.session_id,
                                                        f.session_id_n, "strict");
            if (session_id == NULL) {
                PyErr_Clear();
                break;
            }
            PyObject *machine = PyDict_GetItemWithError(sessions, session_id);
            if (machine == NULL) {
                Py_DECREF(session_id);
                if (PyErr_Occurred()) {
                    goto error;
                }
                break;
            }
            PyObject *state = PyObject_GetAttr(machine, ms->str_state);
            if (state == NULL) {
                Py_DECREF(session_id);
                goto error;
            }
            Py_DECREF(state); /* compared by identity only */
            PyObject *run_id = state == run_open ? PyObject_GetAttr(machine, ms->str_run_id)
                                                 : Py_NewRef(Py_None);
            if (run_id == NULL) {
                Py_DECREF(session_id);
                goto error;
            }
            const char *run = NULL;
            Py_ssize_t run_n = 0;
            if (PyUnicode_Check(run_id)) {
                run = PyUnicode_AsUTF8AndSize(run_id, &run_n);
                if (run == NULL) {
                    PyErr_Clear();
                }
            }
            if (run == NULL || !plain_ascii(run, run_n)) {
                Py_DECREF(session_id);
                Py_DECREF(run_id);
                break;
            }
            if (stretch_flush(&st, make, out) < 0) {
                Py_DECREF(session_id);
                Py_DECREF(run_id);
                goto error;
            }
            st.session_id = session_id;
            st.run_id = run_id;
            st.tails = PyByteArray_FromStringAndSize(NULL, 0);
            if (st.tails == NULL) {
                goto error;
            }
            sid = f.session_id;
            sid_n = f.session_id_n;
        }
        {
            Py_ssize_t run_n;
            const char *run = PyUnicode_AsUTF8AndSize(st.run_id, &run_n);
            if (run == NULL) {
                goto error;
            }
            if (f.run_id_n != run_n || memcmp(f.run_id, run, (size_t)run_n) != 0) {
                break;
            }
        }
        if (f.event_type_n != fact_n || memcmp(f.event_type, fact, (size_t)fact_n) != 0) {
            if (f.event_type_n > (Py_ssize_t)sizeof(fact) ||
                !plain_ascii((const char *)f.event_type, f.event_type_n)) {
                break;
            }
            PyObject *event_type =
                PyUnicode_FromStringAndSize((const char *)f.event_type, f.event_type_n);
            if (event_type == NULL) {
                goto error;
            }
            int known = PySet_Contains(facts, event_type);
            Py_DECREF(event_type);
            if (known < 0) {
                goto error;
            }
            if (!known) {
                break;
            }
            memcpy(fact, f.event_type, (size_t)f.event_type_n);
            fact_n = f.event_type_n;
        }
        if (!json_ok(f.data, f.data_n, max_depth)) {
            break;
        }
        if (stretch_add(&st, &f) < 0) {
            goto error;
        }
        pos += 4 + (Py_ssize_t)length;
    }
    if (stretch_flush(&st, make, out) < 0) {
        goto error;
    }
    PyObject *result = Py_BuildValue("(nN)", pos, out);
    return result;
error:
    stretch_clear(&st);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(append_lines_doc,
             "append_lines(buf, head, seq, tails, /)\n--\n\n"
             "Append to buf, for each tail of tails (each behind its length), head, seq\n"
             "(then seq + 1, ...) and the tail; returns how many lines.");

static PyObject *
speedups_append_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyByteArray_Check(args[0]) || !PyBytes_Check(args[1]) ||
        !PyByteArray_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "append_lines(buf: bytearray, head: bytes, seq: int, tails: bytearray)");
        return NULL;
    }
    PyObject *buf = args[0], *tails = args[3];
    long long seq = PyLong_AsLongLong(args[2]);
    if (seq == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (seq < 0 || seq > (1LL << 62)) {
        PyErr_SetString(PyExc_OverflowError, "append_lines: seq out of range");
        return NULL;
    }
    if (buf == tails) {
        PyErr_SetString(PyExc_ValueError, "append_lines: buf is tails");
        return NULL;
    }
    const char *head = PyBytes_AS_STRING(args[1]);
    Py_ssize_t head_n = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t tails_n = PyByteArray_GET_SIZE(tails);
    /* A first pass for the size and the count, checking every length. */
    Py_ssize_t count = 0, at = 0;
    while (at < tails_n) {
        uint32_t length;
        if (tails_n - at < TAIL_LENGTH) {
            goto bad;
        }
        memcpy(&length, PyByteArray_AS_STRING(tails) + at, TAIL_LENGTH);
        if ((Py_ssize_t)length > tails_n - at - TAIL_LENGTH) {
            goto bad;
        }
        at += TAIL_LENGTH + (Py_ssize_t)length;
        count++;
    }
    /* Each line: head, at most 19 digits, tail; the lengths' room is spare. */
    Py_ssize_t start = PyByteArray_GET_SIZE(buf);
    if (count > (PY_SSIZE_T_MAX - start - tails_n) / (head_n + 20)) {
        return PyErr_NoMemory();
    }
    if (PyByteArray_Resize(buf, start + tails_n + count * (head_n + 19)) < 0) {
        return NULL;
    }
    char *out = PyByteArray_AS_STRING(buf) + start;
    const char *in = PyByteArray_AS_STRING(tails);
    at = 0;
    while (at < tails_n) {
        uint32_t length;
        memcpy(&length, in + at, TAIL_LENGTH);
        at += TAIL_LENGTH;
        memcpy(out, head, (size_t)head_n);
        out += head_n;
        char digits[24];
        int n = 0;
        long long value = seq++;
        do {
            digits[n++] = (char)('0' + value % 10);
            value /= 10;
        } while (value);
        while (n) {
            *out++ = digits[--n];
        }
        memcpy(out, in + at, length);
        out += length;
        at += (Py_ssize_t)length;
    }
    if (PyByteArray_Resize(buf, out - PyByteArray_AS_STRING(buf)) < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(count);
bad:
    PyErr_SetString(PyExc_ValueError, "append_lines: tails are not lengths and tails");
    return NULL;
}

static PyMethodDef speedups_methods[] = {
    {"check_json", (PyCFunction)(void (*)(void))speedups_check_json, METH_FASTCALL,
     check_json_doc},
    {"is_time", (PyCFunction)speedups_is_time, METH_O, is_time_doc},
    {"take_records", (PyCFunction)(void (*)(void))speedups_take_records, METH_FASTCALL,
     take_records_doc},
    {"append_lines", (PyCFunction)(void (*)(void))speedups_append_lines, METH_FASTCALL,
     append_lines_doc},
    {NULL, NULL, 0, NULL},
};

static int
speedups_exec(PyObject *module)
{
    /* The switch that turns the accelerator off: its import fails, and the package
       runs its Python path (docs/operations.md). */
    const char *off = getenv("FLIGHTLOG_NO_SPEEDUPS");
    if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0) {
        PyErr_SetString(PyExc_ImportError, "FLIGHTLOG_NO_SPEEDUPS is set");
        return -1;
    }
    module_state *ms = get_state(module);
    ms->str_state = PyUnicode_InternFromString("state");
    ms->str_run_id = PyUnicode_InternFromString("run_id");
    if (ms->str_state == NULL || ms->str_run_id == NULL) {
        return -1;
    }
    return 0;
}

static int
speedups_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *ms = get_state(module);
    Py_VISIT(ms->str_state);
    Py_VISIT(ms->str_run_id);
    return 0;
}

static int
speedups_clear(PyObject *module)
{
    module_state *ms = get_state(module);
    Py_CLEAR(ms->str_state);
    Py_CLEAR(ms->str_run_id);
    return 0;
}

static void
speedups_free(void *module)
{
    speedups_clear((PyObject *)module);
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, (void *)speedups_exec},
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "flightlog.protocol._speedups",
    .m_doc = "The daemon's per-record path in C, as a fast accept path (see the source).",
    .m_size = sizeof(module_state),
    .m_methods = speedups_methods,
    .m_slots = speedups_slots,
    .m_traverse = speedups_traverse,
    .m_clear = speedups_clear,
    .m_free = speedups_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
