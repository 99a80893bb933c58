/* flightlog.protocol._scan: which lines of a block of JSONL may hold something, in C.

Theory of operation
-------------------
A search through session files (the SDK's find) decodes only the lines that may
match; which ones is decided on bytes.  Each function here is the exact twin of a
Python loop over regular expressions (flightlog.sdk._find, _Prefilter), in one pass at
memchr/memmem speed instead of one pass per pattern at the regex engine's:

* lines_with(buf, end, needle): the start of each line of buf[:end] that holds the
  bytes of needle (the twin: a bytes.find loop), found 16 positions at a time (SSE2).
* lines_always(buf, end, joins): the start of each line of buf[:end] that holds a \u
  or \/ escape (rb"\\[u/]"), or with joins, a text or thinking part that follows
  another part of a content list as the regular expression
  rb'\},\s*\{\s*"\$type"\s*:\s*"(?:text|thinking)"' finds it (a match is placed by
  the line of its first byte; its whitespace may run over a line end, as the
  expression's does).

Both return the starts in order, each line once; buf[:end] is complete lines (end is
0 or just after a \n).  Every read is bounds-checked against end; no Python code runs
during a scan.  Tests hold each equal to its twin on random and hostile input
(tests/sdk/test_find_scan.py).
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Python's \s in a bytes pattern: space, \t, \n, \r, \f, \v. */
static inline int
is_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The start of the line that holds position at. */
static inline Py_ssize_t
line_start(const char *buf, Py_ssize_t at)
{
    while (at > 0 && buf[at - 1] != '\n') {
        at--;
    }
    return at;
}

/* The position of the \n that ends the line holding at (or end). */
static inline Py_ssize_t
line_stop(const char *buf, Py_ssize_t at, Py_ssize_t end)
{
    const char *nl = memchr(buf + at, '\n', (size_t)(end - at));
    return nl == NULL ? end : nl - buf;
}

/* The first occurrence of needle[0:m] in hay[0:n], or NULL: what memmem returns.
   With SSE2 (every x86-64), 16 positions at a time are tested for the needle's first
   and last bytes, and only where both are there is the rest compared: several times
   memmem's speed on text, where the needle's bytes are common.  The positions too
   close to the end for a 16-byte load go to memmem. */
static const char *
find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
#if defined(__SSE2__)
    if (m >= 2) {
        const __m128i first = _mm_set1_epi8(needle[0]);
        const __m128i last = _mm_set1_epi8(needle[m - 1]);
        size_t i = 0;
        /* Both loads, at i and at i + m - 1, stay inside hay[0:n]. */
        for (; i + m + 15 <= n; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(hay + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(hay + i + m - 1));
            unsigned mask = (unsigned)_mm_movemask_epi8(
                _mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, last)));
            while (mask != 0) {
                size_t at = i + (size_t)__builtin_ctz(mask);
                if (memcmp(hay + at + 1, needle + 1, m - 2) == 0) {
                    return hay + at;
                }
                mask &= mask - 1;
            }
        }
        return i < n ? memmem(hay + i, n - i, needle, m) : NULL;
    }
#endif
    return memmem(hay, n, needle, m);
}

/* A growing array of line starts, appended in any order, sorted at the end. */
typedef struct {
    Py_ssize_t *items;
    Py_ssize_t size, capacity;
} starts_t;

static int
starts_add(starts_t *s, Py_ssize_t value)
{
    if (s->size > 0 && s->items[s->size - 1] == value) {
        return 0;
    }
    if (s->size == s->capacity) {
        Py_ssize_t capacity = s->capacity ? s->capacity * 2 : 64;
        Py_ssize_t *items = PyMem_Realloc(s->items, (size_t)capacity * sizeof(Py_ssize_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->items = items;
        s->capacity = capacity;
    }
    s->items[s->size++] = value;
    return 0;
}

static int
compare_starts(const void *a, const void *b)
{
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* The starts as a sorted list of ints without repeats; frees them. */
static PyObject *
starts_list(starts_t *s, int sort)
{
    if (sort && s->size > 1) {
        qsort(s->items, (size_t)s->size, sizeof(Py_ssize_t), compare_starts);
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < s->size; i++) {
        if (i > 0 && s->items[i] == s->items[i - 1]) {
            continue;
        }
        PyObject *value = PyLong_FromSsize_t(s->items[i]);
        if (value == NULL || PyList_Append(list, value) < 0) {
            Py_XDECREF(value);
            Py_CLEAR(list);
            goto done;
        }
        Py_DECREF(value);
    }
done:
    PyMem_Free(s->items);
    s->items = NULL;
    return list;
}

/* Check and clamp end against the buffer's length. */
static int
check_end(Py_buffer *view, Py_ssize_t *end)
{
    if (*end < 0 || *end > view->len) {
        PyErr_SetString(PyExc_ValueError, "end is outside the buffer");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(lines_with_doc,
"lines_with(buf, end, needle, /)\n--\n\n"
"The start of each line of buf[:end] that holds needle, in order.");

static PyObject *
scan_lines_with(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view, needle;
    Py_ssize_t end;
    if (!PyArg_ParseTuple(args, "y*ny*:lines_with", &view, &end, &needle)) {
        return NULL;
    }
    PyObject *result = NULL;
    starts_t starts = {NULL, 0, 0};
    if (check_end(&view, &end) < 0) {
        goto done;
    }
    if (needle.len == 0) {
        PyErr_SetString(PyExc_ValueError, "needle is empty");
        goto done;
    }
    const char *buf = view.buf;
    Py_ssize_t pos = 0;
    while (pos < end) {
        const char *hit = find_bytes(buf + pos, (size_t)(end - pos), needle.buf, (size_t)needle.len);
        if (hit == NULL) {
            break;
        }
        Py_ssize_t at = hit - buf;
        if (starts_add(&starts, line_start(buf, at)) < 0) {
            goto done;
        }
        pos = line_stop(buf, at, end) + 1;
    }
    result = starts_list(&starts, 0);
done:
    PyMem_Free(starts.items);
    PyBuffer_Release(&view);
    PyBuffer_Release(&needle);
    return result;
}

/* Where the match of the joined-parts expression that holds the $ at d starts, or -1. */
static Py_ssize_t
joined_at(const char *buf, Py_ssize_t d, Py_ssize_t end)
{
    static const char type[] = "type\"";
    /* Forward: $type" \s* : \s* "text" or "thinking" */
    Py_ssize_t p = d + 1;
    if (end - p < 5 || memcmp(buf + p, type, 5) != 0) {
        return -1;
    }
    p += 5;
    while (p < end && is_space((unsigned char)buf[p])) {
        p++;
    }
    if (p >= end || buf[p] != ':') {
        return -1;
    }
    p++;
    while (p < end && is_space((unsigned char)buf[p])) {
        p++;
    }
    if (p >= end || buf[p] != '"') {
        return -1;
    }
    p++;
    if (!((end - p >= 5 && memcmp(buf + p, "text\"", 5) == 0) ||
          (end - p >= 9 && memcmp(buf + p, "thinking\"", 9) == 0))) {
        return -1;
    }
    /* Backward: } , \s* { \s* " before the $ */
    Py_ssize_t q = d - 1;
    if (q < 0 || buf[q] != '"') {
        return -1;
    }
    q--;
    while (q >= 0 && is_space((unsigned char)buf[q])) {
        q--;
    }
    if (q < 0 || buf[q] != '{') {
        return -1;
    }
    q--;
    while (q >= 0 && is_space((unsigned char)buf[q])) {
        q--;
    }
    if (q < 1 || buf[q] != ',' || buf[q - 1] != '}') {
        return -1;
    }
    return q - 1;
}

PyDoc_STRVAR(lines_always_doc,
"lines_always(buf, end, joins, /)\n--\n\n"
"The start of each line of buf[:end] that holds a \\u or \\/ escape or, with joins, a\n"
"text or thinking part that follows another part, in order.");

static PyObject *
scan_lines_always(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t end;
    int joins;
    if (!PyArg_ParseTuple(args, "y*np:lines_always", &view, &end, &joins)) {
        return NULL;
    }
    PyObject *result = NULL;
    starts_t starts = {NULL, 0, 0};
    if (check_end(&view, &end) < 0) {
        goto done;
    }
    const char *buf = view.buf;
    const char *at = buf, *stop = buf + end;
    while ((at = memchr(at, '\\', (size_t)(stop - at))) != NULL) {
        if (at + 1 < stop && (at[1] == 'u' || at[1] == '/')) {
            Py_ssize_t where = at - buf;
            if (starts_add(&starts, line_start(buf, where)) < 0) {
                goto done;
            }
            at = buf + line_stop(buf, where, end);
            if (at >= stop) {
                break;
            }
        }
        at++;
    }
    if (joins) {
        at = buf;
        while ((at = memchr(at, '$', (size_t)(stop - at))) != NULL) {
            Py_ssize_t first = joined_at(buf, at - buf, end);
            if (first >= 0 && starts_add(&starts, line_start(buf, first)) < 0) {
                goto done;
            }
            at++;
        }
    }
    result = starts_list(&starts, 1);
done:
    PyMem_Free(starts.items);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef scan_methods[] = {
    {"lines_with", scan_lines_with, METH_VARARGS, lines_with_doc},
    {"lines_always", scan_lines_always, METH_VARARGS, lines_always_doc},
    {NULL, NULL, 0, NULL},
};

static int
scan_exec(PyObject *Py_UNUSED(module))
{
    /* The switch that turns the accelerators off: its import fails, and the Python
       twins run (docs/operations.md). */
    const char *off = getenv("FLIGHTLOG_NO_SPEEDUPS");
    if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0) {
        PyErr_SetString(PyExc_ImportError, "FLIGHTLOG_NO_SPEEDUPS is set");
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot scan_slots[] = {
    {Py_mod_exec, (void *)scan_exec},
    {0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "flightlog.protocol._scan",
    .m_doc = "Which lines of a block of JSONL may hold something, in C (see the source).",
    .m_size = 0,
    .m_methods = scan_methods,
    .m_slots = scan_slots,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModuleDef_Init(&scan_module);
}
