/* The client's per-entry wire work on the add path, in C: an add's whole V3 request frame with its entry's digest
 * (AddFrameEncoder.frame_of), and the OK answers of callback adds read and handed to their waiters in one call per
 * socket read (take_ok_add_answers). In Python these cost ~19k instructions per 1 KiB entry of ceval and small
 * objects (docs/design.md); bkwire.py is the only module that imports this one, and the layouts are bkwire's:
 * AddRequestEncoder's request (protobuf's Request with the AddRequest's entry last) and protobuf's OK AddResponse.
 *
 * CRC32C is computed here: with SSE4.2's crc32 instruction when the CPU has it (8 bytes per instruction, ~0.8k
 * instructions for a 1 KiB entry, and no Python call per entry as the crc32c package would need: it offers no C
 * entry point), else with a byte table (about ten times the instructions, but any CPU). Other
 * digests (CRC32, MAC, none) call the ledger's own digest function from wire.Digester: one Python call per entry.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

#define ENTRY_HEADER_SIZE 32 /* wire.ENTRY_HEADER: ledger id, entry id, lac, length, each 8 bytes big-endian */
#define MAX_FRAME_SIZE (8u * 1024u * 1024u) /* wire.MAX_FRAME_SIZE: a longer answer is bkwire's error to raise */
#define MAX_TXN_SIZE 10 /* a uint64's varint */

static const unsigned char ADD_HEADER[] = {0x08, 0x03, 0x10, 0x02, 0x18}; /* version 3, ADD_ENTRY, txnId's tag */
static const unsigned char OK_ADD_ANSWER[] = {0x10, 0x00, 0xaa, 0x06};     /* status EOK, addResponse's tag */
static const unsigned char OK_ADD_RESPONSE[] = {0x08, 0x00, 0x10};         /* its status EOK, ledgerId's tag */

/* --- CRC32C ------------------------------------------------------------------------------------------------- */

static uint32_t crc32c_table[256];

static uint32_t crc32c_bytes(uint32_t crc, const unsigned char *data, size_t size) {
    crc = ~crc;
    while (size--) crc = crc32c_table[(crc ^ *data++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *data, size_t size) {
    uint64_t value = ~crc;
#if defined(__x86_64__)
    for (; size >= 8; data += 8, size -= 8) {
        uint64_t word;
        memcpy(&word, data, 8);
        value = _mm_crc32_u64(value, word);
    }
#endif
    while (size--) value = _mm_crc32_u8((uint32_t)value, *data++);
    return ~(uint32_t)value;
}
#endif

static uint32_t (*crc32c)(uint32_t, const unsigned char *, size_t) = crc32c_bytes;

static void choose_crc32c(void) {
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++) crc = crc & 1 ? crc >> 1 ^ 0x82f63b78u : crc >> 1;
        crc32c_table[byte] = crc;
    }
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc32c = crc32c_sse42;
#endif
}

/* --- varints and big-endian integers ------------------------------------------------------------------------ */

static inline Py_ssize_t varint_size(uint64_t value) {
    Py_ssize_t size = 1;
    for (; value >= 0x80; value >>= 7) size++;
    return size;
}

static inline unsigned char *put_varint(unsigned char *out, uint64_t value) {
    for (; value >= 0x80; value >>= 7) *out++ = (unsigned char)(value | 0x80);
    *out++ = (unsigned char)value;
    return out;
}

static inline unsigned char *put_be(unsigned char *out, uint64_t value, int size) {
    for (int i = size - 1; i >= 0; i--, value >>= 8) out[i] = (unsigned char)value;
    return out + size;
}

/* --- AddFrameEncoder ---------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint64_t ledger_id;
    PyObject *fixed;  /* bytes: the AddRequest's writer fields, as bkwire.AddRequestEncoder lays them out */
    Py_ssize_t digest_size;
    PyObject *digest; /* None: CRC32C here; else the ledger's digest(header, payload) -> bytes of digest_size */
} AddFrameEncoder;

static PyObject *encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long ledger_id;
    PyObject *fixed, *digest;
    Py_ssize_t digest_size;
    static char *names[] = {"ledger_id", "fixed", "digest_size", "digest", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KSnO:AddFrameEncoder", names, &ledger_id, &fixed, &digest_size,
                                     &digest))
        return NULL;
    if (digest == Py_None ? digest_size != 4 : !PyCallable_Check(digest) || digest_size < 0) {
        PyErr_SetString(PyExc_ValueError, "digest: None for CRC32C (4 bytes), else a callable of digest_size bytes");
        return NULL;
    }
    AddFrameEncoder *self = (AddFrameEncoder *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->ledger_id = ledger_id;
    self->digest_size = digest_size;
    Py_INCREF(fixed);
    self->fixed = fixed;
    Py_INCREF(digest);
    self->digest = digest;
    return (PyObject *)self;
}

static int encoder_traverse(AddFrameEncoder *self, visitproc visit, void *arg) {
    Py_VISIT(self->digest);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int encoder_clear(AddFrameEncoder *self) {
    Py_CLEAR(self->digest);
    Py_CLEAR(self->fixed);
    return 0;
}

static void encoder_dealloc(AddFrameEncoder *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    encoder_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* The digest of header + payload into out: CRC32C here, any other through the ledger's digest function. */
static int put_digest(AddFrameEncoder *self, unsigned char *out, const unsigned char *header, PyObject *payload,
                      const Py_buffer *view) {
    if (self->digest == Py_None) {
        put_be(out, crc32c(crc32c(0, header, ENTRY_HEADER_SIZE), view->buf, (size_t)view->len), 4);
        return 0;
    }
    PyObject *header_bytes = PyBytes_FromStringAndSize((const char *)header, ENTRY_HEADER_SIZE);
    if (header_bytes == NULL) return -1;
    PyObject *digest = PyObject_CallFunctionObjArgs(self->digest, header_bytes, payload, NULL);
    Py_DECREF(header_bytes);
    if (digest == NULL) return -1;
    if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != self->digest_size) {
        PyErr_Format(PyExc_ValueError, "the ledger's digest gave %R, not %zd bytes", digest, self->digest_size);
        Py_DECREF(digest);
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(digest), (size_t)self->digest_size);
    Py_DECREF(digest);
    return 0;
}

PyDoc_STRVAR(frame_of_doc,
"frame_of(txn, entry_id, lac, length, payload) -> bytes\n\n"
"The whole ADD request frame of one entry: bkwire.AddRequestEncoder.frame_head(txn, entry_id, size) followed by\n"
"wire.Digester.encode's entry (header, digest, payload), byte for byte; `txn` is the txnId's varint.");

/* frame_of's frame of args[0:5] (txn, entry_id, lac, length, payload). */
static PyObject *add_frame(AddFrameEncoder *self, PyObject *const *args) {
    PyObject *txn = args[0], *payload = args[4];
    if (!PyBytes_Check(txn) || PyBytes_GET_SIZE(txn) < 1 || PyBytes_GET_SIZE(txn) > MAX_TXN_SIZE) {
        PyErr_SetString(PyExc_ValueError, "txn must be a txnId's varint, 1 to 10 bytes");
        return NULL;
    }
    long long entry_id = PyLong_AsLongLong(args[1]);
    if (entry_id == -1 && PyErr_Occurred()) return NULL;
    long long lac = PyLong_AsLongLong(args[2]);
    if (lac == -1 && PyErr_Occurred()) return NULL;
    unsigned long long length = PyLong_AsUnsignedLongLong(args[3]);
    if (length == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0) return NULL;

    Py_ssize_t txn_size = PyBytes_GET_SIZE(txn), fixed_size = PyBytes_GET_SIZE(self->fixed);
    uint64_t entry_size = ENTRY_HEADER_SIZE + (uint64_t)self->digest_size + (uint64_t)view.len;
    uint64_t message_size = (uint64_t)fixed_size + 2 + varint_size((uint64_t)entry_id) + varint_size(entry_size)
                            + entry_size;
    uint64_t frame_size = 9 + (uint64_t)txn_size + varint_size(message_size) + message_size;
    if (frame_size > UINT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_OverflowError, "an add frame of %llu bytes", (unsigned long long)frame_size);
        return NULL;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)frame_size + 4);
    if (frame == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
    out = put_be(out, frame_size, 4);
    *out++ = 0x0a;
    *out++ = (unsigned char)(sizeof ADD_HEADER + txn_size);
    memcpy(out, ADD_HEADER, sizeof ADD_HEADER);
    out += sizeof ADD_HEADER;
    memcpy(out, PyBytes_AS_STRING(txn), (size_t)txn_size);
    out += txn_size;
    *out++ = 0xaa;
    *out++ = 0x06;
    out = put_varint(out, message_size);
    memcpy(out, PyBytes_AS_STRING(self->fixed), (size_t)fixed_size);
    out += fixed_size;
    *out++ = 0x10;
    out = put_varint(out, (uint64_t)entry_id);
    *out++ = 0x22;
    out = put_varint(out, entry_size);
    unsigned char *header = out;
    out = put_be(out, self->ledger_id, 8);
    out = put_be(out, (uint64_t)entry_id, 8);
    out = put_be(out, (uint64_t)lac, 8);
    out = put_be(out, length, 8);
    if (put_digest(self, out, header, payload, &view) < 0) {
        PyBuffer_Release(&view);
        Py_DECREF(frame);
        return NULL;
    }
    memcpy(out + self->digest_size, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return frame;
}

static PyObject *encoder_frame_of(AddFrameEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "frame_of takes 5 arguments, %zd given", nargs);
        return NULL;
    }
    return add_frame(self, args);
}

/* --- PendingAdd --------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long entry_id;
    long long length;
    PyObject *body;
    PyObject *txn;
    PyObject *on_done;
    double sent_at;
    PyObject *acks;
    PyObject *owed;
} PendingAdd;

static PyTypeObject *pending_add_type; /* set by module_exec; the module lives as long as the process */

static int pending_add_traverse(PendingAdd *self, visitproc visit, void *arg) {
    Py_VISIT(self->on_done);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int pending_add_clear(PendingAdd *self) {
    Py_CLEAR(self->body);
    Py_CLEAR(self->txn);
    Py_CLEAR(self->on_done);
    Py_CLEAR(self->acks);
    Py_CLEAR(self->owed);
    return 0;
}

static void pending_add_dealloc(PendingAdd *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    pending_add_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMemberDef pending_add_members[] = {
    {"entry_id", T_LONGLONG, offsetof(PendingAdd, entry_id), READONLY, NULL},
    {"length", T_LONGLONG, offsetof(PendingAdd, length), READONLY, NULL},
    {"body", T_OBJECT_EX, offsetof(PendingAdd, body), READONLY,
     "The whole ADD_ENTRY request frame, the encoded entry in it: built once, sent unchanged to the whole write set."},
    {"txn", T_OBJECT_EX, offsetof(PendingAdd, txn), READONLY,
     "The txnId's varint in `body`: unique on every connection, so the one frame serves them all."},
    {"on_done", T_OBJECT_EX, offsetof(PendingAdd, on_done), READONLY, NULL},
    {"sent_at", T_DOUBLE, offsetof(PendingAdd, sent_at), 0, "When it was last sent (time.monotonic's clock)."},
    {"acks", T_OBJECT_EX, offsetof(PendingAdd, acks), 0, "Bit p set: ensemble position p has the entry durably."},
    {"owed", T_OBJECT_EX, offsetof(PendingAdd, owed), 0,
     "Bit p set: the bookie at position p was sent the entry (or holds it in its backlog) and has not answered."},
    {NULL},
};

static PyType_Slot pending_add_slots[] = {
    {Py_tp_dealloc, pending_add_dealloc},
    {Py_tp_traverse, pending_add_traverse},
    {Py_tp_clear, pending_add_clear},
    {Py_tp_members, pending_add_members},
    {Py_tp_doc, "One add of a ledger writer until every bookie it was sent to answered (BookKeeper's PendingAddOp);\n"
                "made by AddFrameEncoder.pending_add."},
    {0, NULL},
};

static PyType_Spec pending_add_spec = {
    "bookfleet._clientadds.PendingAdd", sizeof(PendingAdd), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    pending_add_slots,
};

PyDoc_STRVAR(pending_add_doc,
"pending_add(txn, entry_id, lac, length, payload, on_done) -> PendingAdd\n\n"
"The writer's object of one add: its frame as frame_of makes it (`body`), `txn`, `entry_id`, `length`, `on_done`,\n"
"`sent_at` now (CLOCK_MONOTONIC: time.monotonic's clock) and no acks or answers owed yet.");

static PyObject *encoder_pending_add(AddFrameEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "pending_add takes 6 arguments, %zd given", nargs);
        return NULL;
    }
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *body = add_frame(self, args); /* checks entry_id and length: they are ints below */
    if (body == NULL) return NULL;
    PendingAdd *add = PyObject_GC_New(PendingAdd, pending_add_type);
    if (add == NULL) {
        Py_DECREF(body);
        return NULL;
    }
    add->entry_id = PyLong_AsLongLong(args[1]);
    add->length = PyLong_AsLongLong(args[3]);
    add->body = body;
    Py_INCREF(args[0]);
    add->txn = args[0];
    Py_INCREF(args[5]);
    add->on_done = args[5];
    add->sent_at = (double)now.tv_sec + now.tv_nsec * 1e-9;
    PyObject *zero = PyLong_FromLong(0);
    add->acks = zero;
    Py_INCREF(zero);
    add->owed = zero;
    PyObject_GC_Track(add);
    if (add->length == -1 && PyErr_Occurred()) {
        Py_DECREF(add);
        return NULL;
    }
    return (PyObject *)add;
}

static PyMethodDef encoder_methods[] = {
    {"frame_of", (PyCFunction)(void (*)(void))encoder_frame_of, METH_FASTCALL, frame_of_doc},
    {"pending_add", (PyCFunction)(void (*)(void))encoder_pending_add, METH_FASTCALL, pending_add_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot encoder_slots[] = {
    {Py_tp_new, encoder_new},
    {Py_tp_dealloc, encoder_dealloc},
    {Py_tp_traverse, encoder_traverse},
    {Py_tp_clear, encoder_clear},
    {Py_tp_methods, encoder_methods},
    {Py_tp_doc, "AddFrameEncoder(ledger_id, fixed, digest_size, digest): one writer's add frames (bkwire's)."},
    {0, NULL},
};

static PyType_Spec encoder_spec = {
    "bookfleet._clientadds.AddFrameEncoder", sizeof(AddFrameEncoder), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, encoder_slots,
};

/* --- OK add answers ----------------------------------------------------------------------------------------- */

/* Where the varint at data[pos] ends (the index after it), or -1: at most max_continued bytes >= 0x80 before a byte
 * below it, all before end. */
static inline Py_ssize_t varint_end(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end, int max_continued) {
    for (int continued = 0; pos < end; pos++, continued++) {
        if (data[pos] < 0x80) return pos + 1;
        if (continued == max_continued) return -1;
    }
    return -1;
}

/* The txnId's varint (at data[*txn_start:*txn_end]) of frame data[0:size] (without its length prefix) if it is an
 * OK ADD answer as protobuf lays one out: a header of version 3, ADD_ENTRY and the txnId only, status EOK, an
 * AddResponse of status EOK, ledger id and entry id (each at most 9 bytes: an int64), nothing else. */
static int ok_add_answer(const unsigned char *data, Py_ssize_t size, Py_ssize_t *txn_start, Py_ssize_t *txn_end) {
    Py_ssize_t pos = 2 + sizeof ADD_HEADER;
    if (size < pos || data[0] != 0x0a || memcmp(data + 2, ADD_HEADER, sizeof ADD_HEADER) != 0) return 0;
    Py_ssize_t txn = varint_end(data, pos, size, 9);
    if (txn < 0 || (txn - pos == 10 && data[txn - 1] > 1) || data[1] != txn - 2) return 0; /* uint64 */
    pos = txn + sizeof OK_ADD_ANSWER;
    if (size < pos + 1 + (Py_ssize_t)sizeof OK_ADD_RESPONSE || memcmp(data + txn, OK_ADD_ANSWER, sizeof OK_ADD_ANSWER)
        || data[pos] != size - pos - 1 || memcmp(data + pos + 1, OK_ADD_RESPONSE, sizeof OK_ADD_RESPONSE))
        return 0;
    pos = varint_end(data, pos + 1 + sizeof OK_ADD_RESPONSE, size, 8);
    if (pos < 0 || pos >= size || data[pos] != 0x18 || varint_end(data, pos + 1, size, 8) != size) return 0;
    *txn_start = 2 + sizeof ADD_HEADER;
    *txn_end = txn;
    return 1;
}

PyDoc_STRVAR(take_doc,
"take_ok_add_answers(buffer, pending) -> None\n\n"
"Hand the OK ADD answers at the front of `buffer` (a bytearray of length-prefixed answers) to their waiters and\n"
"delete them from it: for each, the waiter `pending` (a dict) holds under the answer's txnId varint, when it is an\n"
"(on_answer, arg) tuple, is popped and called on_answer(arg, None). Stops at the first frame that is not whole, is\n"
"longer than the frame limit, is no OK ADD answer as protobuf lays one out, or has no such waiter: the caller\n"
"reads it. An exception from on_answer is raised once the answers before it are taken off.");

static PyObject *take_ok_add_answers(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyByteArray_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_ok_add_answers(buffer: bytearray, pending: dict)");
        return NULL;
    }
    PyObject *buffer = args[0], *pending = args[1];
    Py_ssize_t pos = 0;
    int failed = 0;
    for (;;) {
        /* Read again after every call out: a waiter may have grown the buffer (never shrunk: only the reader does). */
        const unsigned char *data = (const unsigned char *)PyByteArray_AS_STRING(buffer);
        Py_ssize_t size = PyByteArray_GET_SIZE(buffer), txn_start, txn_end;
        if (size - pos < 4) break;
        uint32_t length = (uint32_t)data[pos] << 24 | (uint32_t)data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3];
        if (length > MAX_FRAME_SIZE || (Py_ssize_t)length > size - pos - 4) break;
        const unsigned char *frame = data + pos + 4;
        if (!ok_add_answer(frame, length, &txn_start, &txn_end)) break;
        PyObject *txn = PyBytes_FromStringAndSize((const char *)frame + txn_start, txn_end - txn_start);
        if (txn == NULL) {
            failed = 1;
            break;
        }
        PyObject *waiter = PyDict_GetItemWithError(pending, txn);
        if (waiter == NULL || !PyTuple_CheckExact(waiter) || PyTuple_GET_SIZE(waiter) != 2) {
            failed = PyErr_Occurred() != NULL;
            Py_DECREF(txn);
            break;
        }
        Py_INCREF(waiter);
        failed = PyDict_DelItem(pending, txn) < 0;
        Py_DECREF(txn);
        if (failed) {
            Py_DECREF(waiter);
            break;
        }
        pos += 4 + (Py_ssize_t)length;
        PyObject *call_args[2] = {PyTuple_GET_ITEM(waiter, 1), Py_None};
        PyObject *result = PyObject_Vectorcall(PyTuple_GET_ITEM(waiter, 0), call_args, 2, NULL);
        Py_DECREF(waiter);
        if (result == NULL) {
            failed = 1;
            break;
        }
        Py_DECREF(result);
    }
    if (pos > 0) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (PySequence_DelSlice(buffer, 0, pos) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            return NULL;
        }
        PyErr_Restore(type, value, traceback);
    }
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* --- the module --------------------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"take_ok_add_answers", (PyCFunction)(void (*)(void))take_ok_add_answers, METH_FASTCALL, take_doc},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    choose_crc32c();
    pending_add_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &pending_add_spec, NULL);
    if (pending_add_type == NULL) return -1;
    Py_INCREF(pending_add_type);
    if (PyModule_AddObject(module, "PendingAdd", (PyObject *)pending_add_type) < 0) {
        Py_DECREF(pending_add_type);
        return -1;
    }
    PyObject *encoder = PyType_FromModuleAndSpec(module, &encoder_spec, NULL);
    if (encoder == NULL) return -1;
    int failed = PyModule_AddObject(module, "AddFrameEncoder", encoder);
    if (failed) Py_DECREF(encoder);
    return failed;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef clientadds_module = {
    PyModuleDef_HEAD_INIT, "_clientadds",
    "The client's add frames and their OK answers, encoded and read in C: bkwire's per-entry loops.", 0,
    module_methods, module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__clientadds(void) { return PyModuleDef_Init(&clientadds_module); }
