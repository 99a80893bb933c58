/* flightlog.protocol._sender: the client's per-record path in C.

Theory of operation
-------------------
Two pieces of what every record() runs after the codec, each the exact twin of its
Python version (tests/protocol/test_sender.py holds them equal):

* encode_record: the frame of one RecordEvent, byte for byte what msgspec writes
  (FrameEncoder.encode): the 4-byte big-endian length, then a map of the tag and the
  five fields in their declared order, strings in the shortest msgpack str form and
  data as bin.  It answers None when it is not sure (an argument of another type, a
  string that is not valid UTF-8, a body larger than the frame limit): the caller then
  runs the Python encoder, which raises its own typed error.  One allocation, one
  copy of the data.
* RingWriter: the client's end of the ring (flightlog.protocol._ring, whose
  docstring has the layout and the wake-up protocol), with its fence a real one
  (__atomic_thread_fence, sequentially consistent) instead of the lock the Python
  end borrows.  Same methods, same answers, same checks of what the daemon writes:
  each shared word is loaded once into a local and checked before it is used (a
  new ring's head and tail are 0; head lies between the last head read and the
  writer's own tail), and a bad one raises what the Python end raises, with nothing
  written.  So no header, however and whenever the daemon's side rewrites it, makes
  a copy leave the data area (tests/protocol/test_sender.py, also under
  AddressSanitizer and UBSan; built with FLIGHTLOG_RING_SCRIPT, every load of a
  header word takes a test's value, and must be one the Python end makes too).

No Python code runs during a call: the GIL holds other threads off the ring.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- encode_record */

/* The bytes msgpack takes to write a str of n bytes (its header), as msgspec picks. */
static inline Py_ssize_t
str_header(Py_ssize_t n)
{
    return n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5;
}

static inline Py_ssize_t
bin_header(Py_ssize_t n)
{
    return n < 256 ? 2 : n < 65536 ? 3 : 5;
}

static inline char *
put_be(char *out, uint64_t value, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--) {
        *out++ = (char)((value >> (8 * i)) & 0xff);
    }
    return out;
}

/* A length behind the first of three tags that holds it: 8, 16 or 32 bits. */
static inline char *
put_length(char *out, Py_ssize_t n, unsigned char tag8)
{
    if (n < 256) {
        *out++ = (char)tag8;
        return put_be(out, (uint64_t)n, 1);
    }
    if (n < 65536) {
        *out++ = (char)(tag8 + 1);
        return put_be(out, (uint64_t)n, 2);
    }
    *out++ = (char)(tag8 + 2);
    return put_be(out, (uint64_t)n, 4);
}

static inline char *
put_str(char *out, const char *s, Py_ssize_t n)
{
    if (n < 32) {
        *out++ = (char)(0xa0 | n);
    }
    else {
        out = put_length(out, n, 0xd9); /* str8, str16, str32 */
    }
    memcpy(out, s, (size_t)n);
    return out + n;
}

static inline char *
put_bin(char *out, const char *s, Py_ssize_t n)
{
    out = put_length(out, n, 0xc4); /* bin8, bin16, bin32 */
    memcpy(out, s, (size_t)n);
    return out + n;
}

/* The map header, the tag, and each field's key, as msgspec writes them. */
static const char MAP_AND_TAG[] = "\x86\xa4type\xa6record";
static const char KEY_SESSION_ID[] = "\xaasession_id";
static const char KEY_RUN_ID[] = "\xa6run_id";
static const char KEY_EVENT_TYPE[] = "\xaa" "event_type";
static const char KEY_TIME[] = "\xa4time";
static const char KEY_DATA[] = "\xa4" "data";
#define KEY(k) (k), (Py_ssize_t)(sizeof(k) - 1)
#define FIELDS 4 /* the str fields */

static inline char *
put_raw(char *out, const char *s, Py_ssize_t n)
{
    memcpy(out, s, (size_t)n);
    return out + n;
}

PyDoc_STRVAR(encode_record_doc,
             "encode_record(session_id, run_id, event_type, time, data, max_frame_size)\n"
             "--\n\n"
             "The frame of RecordEvent(...) as FrameEncoder(max_frame_size).encode() makes\n"
             "it, or None when not sure (then the Python encoder runs).");

static PyObject *
sender_encode_record(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "encode_record takes 6 arguments");
        return NULL;
    }
    PyObject *data = args[4];
    Py_ssize_t limit = PyLong_AsSsize_t(args[5]);
    if (limit < 0) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return NULL;
        }
        /* A limit past any frame (or none to speak of): the Python encoder decides. */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyBytes_CheckExact(data)) {
        Py_RETURN_NONE;
    }
    const char *text[FIELDS];
    Py_ssize_t length[FIELDS];
    for (int i = 0; i < FIELDS; i++) {
        if (!PyUnicode_CheckExact(args[i])) {
            Py_RETURN_NONE;
        }
        text[i] = PyUnicode_AsUTF8AndSize(args[i], &length[i]);
        if (text[i] == NULL) {
            /* A lone surrogate: msgspec names the error its own way. */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t data_length = PyBytes_GET_SIZE(data);
    const Py_ssize_t keys = sizeof(MAP_AND_TAG) - 1 + sizeof(KEY_SESSION_ID) - 1 +
                            sizeof(KEY_RUN_ID) - 1 + sizeof(KEY_EVENT_TYPE) - 1 +
                            sizeof(KEY_TIME) - 1 + sizeof(KEY_DATA) - 1;
    Py_ssize_t body = keys;
    for (int i = 0; i < FIELDS; i++) {
        if (length[i] > (Py_ssize_t)UINT32_MAX) {
            Py_RETURN_NONE;
        }
        body += str_header(length[i]) + length[i];
    }
    if (data_length > (Py_ssize_t)UINT32_MAX || data_length > PY_SSIZE_T_MAX - body - 9) {
        Py_RETURN_NONE;
    }
    body += bin_header(data_length) + data_length;
    if (body > limit || body > (Py_ssize_t)UINT32_MAX) {
        Py_RETURN_NONE;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, 4 + body);
    if (frame == NULL) {
        return NULL;
    }
    char *out = put_be(PyBytes_AS_STRING(frame), (uint64_t)body, 4);
    out = put_raw(out, KEY(MAP_AND_TAG));
    out = put_raw(out, KEY(KEY_SESSION_ID));
    out = put_str(out, text[0], length[0]);
    out = put_raw(out, KEY(KEY_RUN_ID));
    out = put_str(out, text[1], length[1]);
    out = put_raw(out, KEY(KEY_EVENT_TYPE));
    out = put_str(out, text[2], length[2]);
    out = put_raw(out, KEY(KEY_TIME));
    out = put_str(out, text[3], length[3]);
    out = put_raw(out, KEY(KEY_DATA));
    out = put_bin(out, PyBytes_AS_STRING(data), data_length);
    assert(out == PyBytes_AS_STRING(frame) + 4 + body);
    return frame;
}

/* ------------------------------------------------------------------ RingWriter */

/* The layout of flightlog.protocol._ring: header bytes, and word indexes in it. */
#define RING_HEADER 256
#define MAGIC 0x6f6c746867696c66ULL /* "flightlo", little-endian */
enum { W_MAGIC = 0, W_SIZE = 1, W_HEAD = 8, W_TAIL = 16, W_WAITING = 17, W_ASLEEP = 24 };

/* flightlog.protocol.RemoteProtocolError, what a broken header raises (taken at import). */
static PyObject *RemoteProtocolError = NULL;

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the whole mapping; view.buf NULL once released */
    volatile uint64_t *words;
    unsigned char *data;
    uint64_t size;
    uint64_t mask;
    uint64_t tail;
    uint64_t head; /* as last read */
    uint64_t poked; /* the daemon's wait poked last */
} RingWriterObject;

#ifdef FLIGHTLOG_RING_SCRIPT
/* Tests only (tests/protocol/test_sender.py builds the module with it; no build of the
   package does): each load of a header word takes the next value of that word's
   script, stored there first as the daemon's side may have done just before, and is
   noted in a trace.  So a test gives every load a value of its own, and sees which
   loads a call makes and in what order: the Python writer must make the same. */
#define SCRIPT_WORDS (RING_HEADER / 8)
#define SCRIPT_LENGTH 64
static struct {
    uint64_t values[SCRIPT_LENGTH];
    Py_ssize_t count, next;
} script[SCRIPT_WORDS];
static int scripted = 0;
static unsigned char trace[4096];
static Py_ssize_t traced = 0;
#endif

/* A header word, loaded once: every value read from the header goes through here. */
static inline uint64_t
load_at(volatile uint64_t *words, int index)
{
#ifdef FLIGHTLOG_RING_SCRIPT
    if (scripted) {
        if (traced < (Py_ssize_t)sizeof(trace)) {
            trace[traced++] = (unsigned char)index;
        }
        if (script[index].next < script[index].count) {
            __atomic_store_n(&words[index], script[index].values[script[index].next++],
                             __ATOMIC_RELAXED);
        }
    }
#endif
    return __atomic_load_n(&words[index], __ATOMIC_RELAXED);
}

static inline uint64_t
load_word(RingWriterObject *self, int index)
{
    return load_at(self->words, index);
}

static inline void
store_word(RingWriterObject *self, int index, uint64_t value)
{
    __atomic_store_n(&self->words[index], value, __ATOMIC_RELAXED);
}

static int
ring_released(RingWriterObject *self)
{
    if (self->view.buf == NULL) {
        /* As a released memoryview says it, which the Python end would use. */
        PyErr_SetString(PyExc_ValueError, "operation forbidden on released ring");
        return 1;
    }
    return 0;
}

static int
RingWriter_init(RingWriterObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *buf;
    static char *names[] = {"buf", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:RingWriter", names, &buf)) {
        return -1;
    }
    if (self->view.buf != NULL) {
        PyBuffer_Release(&self->view);
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0) {
        self->view.buf = NULL;
        return -1;
    }
    Py_ssize_t len = self->view.len;
    uintptr_t at = (uintptr_t)self->view.buf;
    const char *why = NULL;
    if (len < RING_HEADER) {
        why = "a ring's mapping is smaller than its header";
    }
    else if (at % 8) {
        why = "a ring's mapping is not aligned";
    }
    else {
        volatile uint64_t *words = (volatile uint64_t *)self->view.buf;
        uint64_t size = load_at(words, W_SIZE);
        if (load_at(words, W_MAGIC) != MAGIC || size == 0 || (size & (size - 1)) ||
            size > (uint64_t)PY_SSIZE_T_MAX - RING_HEADER ||
            (uint64_t)len != RING_HEADER + size) {
            why = "the mapping is not a ring of the size it announces";
        }
        else if (load_at(words, W_HEAD) || load_at(words, W_TAIL)) {
            why = "the ring is not new: its head or tail is not 0";
        }
        else {
            self->words = words;
            self->data = (unsigned char *)self->view.buf + RING_HEADER;
            self->size = size;
            self->mask = size - 1;
            self->tail = 0;
            self->head = 0;
            self->poked = 0;
        }
    }
    if (why != NULL) {
        PyBuffer_Release(&self->view);
        self->view.buf = NULL;
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    return 0;
}

static void
RingWriter_dealloc(RingWriterObject *self)
{
    if (self->view.buf != NULL) {
        PyBuffer_Release(&self->view);
    }
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* The daemon's head, loaded once and checked: it never goes back and never passes the
   tail (so the room is 0 to size).  -1 with RemoteProtocolError set when it does. */
static int
read_head(RingWriterObject *self, uint64_t *out)
{
    uint64_t head = load_word(self, W_HEAD);
    if (head < self->head || head > self->tail) {
        PyObject *message = PyUnicode_FromFormat(
            "the ring's head %llu is not between its last head %llu and its tail %llu",
            (unsigned long long)head, (unsigned long long)self->head,
            (unsigned long long)self->tail);
        if (message == NULL) {
            return -1;
        }
        PyObject *args = PyTuple_Pack(1, message);
        Py_DECREF(message);
        PyObject *kwargs = args == NULL ? NULL : Py_BuildValue("{s:s}", "code", "bad_message");
        PyObject *error = kwargs == NULL ? NULL : PyObject_Call(RemoteProtocolError, args, kwargs);
        Py_XDECREF(args);
        Py_XDECREF(kwargs);
        if (error != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(error), error);
            Py_DECREF(error);
        }
        return -1;
    }
    self->head = head;
    *out = head;
    return 0;
}

/* After storing tail: the fence, then whether to poke (a wait not poked yet). */
static inline int
poke_due(RingWriterObject *self)
{
    uint64_t asleep = load_word(self, W_ASLEEP);
    if (asleep == 0 || asleep == self->poked) {
        return 0;
    }
    self->poked = asleep;
    return 1;
}

PyDoc_STRVAR(write_doc, "write(data) -> (taken, poke): as flightlog.protocol.RingWriter.write.");

static PyObject *
RingWriter_write(RingWriterObject *self, PyObject *arg)
{
    if (ring_released(self)) {
        return NULL;
    }
    Py_buffer in;
    if (PyObject_GetBuffer(arg, &in, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint64_t n = (uint64_t)in.len;
    uint64_t room = self->size - (self->tail - self->head);
    if (room < n) {
        uint64_t head;
        if (read_head(self, &head) < 0) {
            PyBuffer_Release(&in);
            return NULL;
        }
        room = self->size - (self->tail - head);
        if (room == 0) {
            PyBuffer_Release(&in);
            return Py_BuildValue("(nO)", (Py_ssize_t)0, Py_False);
        }
        if (room < n) {
            n = room;
        }
    }
    uint64_t start = self->tail & self->mask;
    uint64_t first = self->size - start;
    if (n <= first) {
        memcpy(self->data + start, in.buf, (size_t)n);
    }
    else {
        memcpy(self->data + start, in.buf, (size_t)first);
        memcpy(self->data, (const char *)in.buf + first, (size_t)(n - first));
    }
    PyBuffer_Release(&in);
    self->tail += n;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    store_word(self, W_TAIL, self->tail);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return Py_BuildValue("(nO)", (Py_ssize_t)n, poke_due(self) ? Py_True : Py_False);
}

PyDoc_STRVAR(poke_due_doc,
             "poke_due() -> bool: as flightlog.protocol.RingWriter.poke_due.");

static PyObject *
RingWriter_poke_due(RingWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (ring_released(self)) {
        return NULL;
    }
    return PyBool_FromLong(poke_due(self));
}

static PyObject *
RingWriter_room(RingWriterObject *self, void *Py_UNUSED(closure))
{
    if (ring_released(self)) {
        return NULL;
    }
    uint64_t head;
    if (read_head(self, &head) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(self->size - (self->tail - head));
}

PyDoc_STRVAR(wait_doc, "wait() -> int: as flightlog.protocol.RingWriter.wait.");

static PyObject *
RingWriter_wait(RingWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (ring_released(self)) {
        return NULL;
    }
    store_word(self, W_WAITING, 1);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return RingWriter_room(self, NULL);
}

PyDoc_STRVAR(waited_doc, "waited(): as flightlog.protocol.RingWriter.waited.");

static PyObject *
RingWriter_waited(RingWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (ring_released(self)) {
        return NULL;
    }
    store_word(self, W_WAITING, 0);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(release_doc, "release(): let go of the mapping.");

static PyObject *
RingWriter_release(RingWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->view.buf != NULL) {
        PyBuffer_Release(&self->view);
        self->view.buf = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
RingWriter_get_size(RingWriterObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->size);
}

static PyMethodDef RingWriter_methods[] = {
    {"write", (PyCFunction)RingWriter_write, METH_O, write_doc},
    {"poke_due", (PyCFunction)RingWriter_poke_due, METH_NOARGS, poke_due_doc},
    {"wait", (PyCFunction)RingWriter_wait, METH_NOARGS, wait_doc},
    {"waited", (PyCFunction)RingWriter_waited, METH_NOARGS, waited_doc},
    {"release", (PyCFunction)RingWriter_release, METH_NOARGS, release_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RingWriter_getset[] = {
    {"room", (getter)RingWriter_room, NULL, "Bytes that can be written now.", NULL},
    {"size", (getter)RingWriter_get_size, NULL, "The data area's size.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot RingWriter_slots[] = {
    {Py_tp_doc, "The client's end of a ring, in C: see flightlog.protocol.RingWriter."},
    {Py_tp_init, RingWriter_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, RingWriter_dealloc},
    {Py_tp_methods, RingWriter_methods},
    {Py_tp_getset, RingWriter_getset},
    {0, NULL},
};

static PyType_Spec RingWriter_spec = {
    .name = "flightlog.protocol._sender.RingWriter",
    .basicsize = sizeof(RingWriterObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = RingWriter_slots,
};

/* ------------------------------------------------------------------ the module */

#ifdef FLIGHTLOG_RING_SCRIPT
/* script({word: [values]}) scripts the loads from now on and empties the trace;
   script(None) ends it.  trace() -> the words loaded since, in order. */
static PyObject *
sender_script(PyObject *Py_UNUSED(module), PyObject *scripts)
{
    for (int i = 0; i < SCRIPT_WORDS; i++) {
        script[i].count = script[i].next = 0;
    }
    traced = 0;
    scripted = 0;
    if (scripts == Py_None) {
        Py_RETURN_NONE;
    }
    if (!PyDict_Check(scripts)) {
        PyErr_SetString(PyExc_TypeError, "script takes a dict or None");
        return NULL;
    }
    scripted = 1;
    PyObject *key, *values;
    Py_ssize_t at = 0;
    while (PyDict_Next(scripts, &at, &key, &values)) {
        long index = PyLong_AsLong(key);
        Py_ssize_t count = PyList_Size(values);
        if (index < 0 || index >= SCRIPT_WORDS || count < 0 || count > SCRIPT_LENGTH) {
            scripted = 0;
            PyErr_SetString(PyExc_ValueError, "a script of a word out of the header");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < count; k++) {
            script[index].values[k] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(values, k));
        }
        script[index].count = count;
        if (PyErr_Occurred()) {
            scripted = 0;
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
sender_trace(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(traced);
    for (Py_ssize_t i = 0; list != NULL && i < traced; i++) {
        PyList_SET_ITEM(list, i, PyLong_FromLong(trace[i]));
    }
    return list;
}
#endif

static PyMethodDef sender_methods[] = {
    {"encode_record", (PyCFunction)(void (*)(void))sender_encode_record, METH_FASTCALL,
     encode_record_doc},
#ifdef FLIGHTLOG_RING_SCRIPT
    {"script", (PyCFunction)sender_script, METH_O, NULL},
    {"trace", (PyCFunction)sender_trace, METH_NOARGS, NULL},
#endif
    {NULL, NULL, 0, NULL},
};

static int
sender_exec(PyObject *module)
{
    /* The same switch as _speedups': its import fails, the Python path runs. */
    const char *off = getenv("FLIGHTLOG_NO_SPEEDUPS");
    if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0) {
        PyErr_SetString(PyExc_ImportError, "FLIGHTLOG_NO_SPEEDUPS is set");
        return -1;
    }
    if (RemoteProtocolError == NULL) {
        PyObject *errors = PyImport_ImportModule("flightlog.protocol._errors");
        if (errors == NULL) {
            return -1;
        }
        RemoteProtocolError = PyObject_GetAttrString(errors, "RemoteProtocolError");
        Py_DECREF(errors);
        if (RemoteProtocolError == NULL) {
            return -1;
        }
    }
    PyObject *type = PyType_FromModuleAndSpec(module, &RingWriter_spec, NULL);
    if (type == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "RingWriter", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot sender_slots[] = {
    {Py_mod_exec, (void *)sender_exec},
    {0, NULL},
};

static struct PyModuleDef sender_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "flightlog.protocol._sender",
    .m_doc = "The client's per-record path in C (see the source).",
    .m_size = 0,
    .m_methods = sender_methods,
    .m_slots = sender_slots,
};

PyMODINIT_FUNC
PyInit__sender(void)
{
    return PyModuleDef_Init(&sender_module);
}
