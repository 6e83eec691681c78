/* The bookie's per-entry add loop (bkwire.py is the only module that imports this and re-exports it): every whole
 * add of one writer lying in a connection's read buffer read in place, V2 as BookKeeper's client lays it out and V3
 * as bkwire.AddRequestEncoder does, and a run's OK answers encoded in one call.
 *
 * It exists because the profile proved this loop dominant (docs/design.md): in Python each add cost a regex match,
 * a re-encoding of its frame head, a tuple and four list appends. A frame is read only if every field passes the
 * generic decoder's checks and its bytes are exactly what the layout writes for those fields; anything else ends
 * the run and goes to the generic decoder (tests/bookie/test_bkwire.py feeds both random and mutated frames). It
 * never reads outside [pos, end) of the buffer, which it holds (a bytearray cannot be resized meanwhile), and it
 * runs with the GIL held throughout: it builds Python objects all along. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_FRAME_SIZE (8 * 1024 * 1024) /* wire.MAX_FRAME_SIZE */
#define MASTER_KEY_SIZE 20
#define ENTRY_HEADER_SIZE 32 /* ledger id, entry id, lac, length */
#define V2_PREFIX_SIZE (4 + MASTER_KEY_SIZE + 8) /* header, master key, the entry header's ledger id */
#define V2_MIN_FRAME (4 + 4 + MASTER_KEY_SIZE + ENTRY_HEADER_SIZE)
#define V2_VERSION 2
#define V2_ADD 1
#define V2_RECOVERY_ADD 2

/* One add read in place: the writer's bytes (what every add of one writer repeats), the add's own fields. */
typedef struct {
    Py_ssize_t frame_end;
    uint32_t length; /* the length prefix: what the add-byte limits are checked against */
    const uint8_t *writer;
    Py_ssize_t writer_size;
    const uint8_t *txn; /* V3's txnId varint as it came (echoed in the answer); none in V2 */
    Py_ssize_t txn_size;
    const uint8_t *entry;
    Py_ssize_t entry_size;
    int64_t entry_id, lac;
    uint64_t ledger_id, writer_epoch;
    const uint8_t *master_key;
    int recovery;
} Add;

static inline uint64_t be64(const uint8_t *p) {
    uint64_t value = 0;
    for (int i = 0; i < 8; i++) value = value << 8 | p[i];
    return value;
}

static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The size of the varint at p (0: none of at most max_size bytes before limit, or with `canonical` not as
 * protobuf writes it: a last byte of 0 after others). Its value in *value (the bits past 64 of a 10-byte one are
 * the caller's to check). */
static inline Py_ssize_t read_varint(const uint8_t *p, const uint8_t *limit, int max_size, int canonical,
                                     uint64_t *value) {
    uint64_t result = 0;
    for (int i = 0; i < max_size && p + i < limit; i++) {
        result |= (uint64_t)(p[i] & 0x7F) << (7 * i);
        if (!(p[i] & 0x80)) {
            if (canonical && i > 0 && p[i] == 0) return 0;
            *value = result;
            return i + 1;
        }
    }
    return 0;
}

/* The frame at buf[pos:end] as a whole frame of at most MAX_FRAME_SIZE bytes: its end, or 0. */
static inline Py_ssize_t whole_frame(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, uint32_t *length) {
    if (end - pos < 4) return 0;
    *length = be32(buf + pos);
    if (*length > MAX_FRAME_SIZE || end - pos - 4 < (Py_ssize_t)*length) return 0;
    return pos + 4 + *length;
}

/* A V2 ADD as bkwire.decode_v2_request and check_v2_request accept it: version 2, op ADD, any flags, a master key
 * and an entry header whose ids are in range (ledger and entry id >= 0, lac >= -1). */
static int parse_v2(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Add *add) {
    Py_ssize_t frame_end = whole_frame(buf, pos, end, &add->length);
    if (frame_end == 0 || frame_end - pos < V2_MIN_FRAME) return 0;
    const uint8_t *frame = buf + pos + 4;
    if (frame[0] != V2_VERSION || frame[1] != V2_ADD) return 0;
    const uint8_t *entry = frame + 4 + MASTER_KEY_SIZE;
    int64_t ledger_id = (int64_t)be64(entry);
    add->entry_id = (int64_t)be64(entry + 8);
    add->lac = (int64_t)be64(entry + 16);
    if (ledger_id < 0 || add->entry_id < 0 || add->lac < -1) return 0;
    *add = (Add){
        .length = add->length, .frame_end = frame_end, .writer = frame, .writer_size = V2_PREFIX_SIZE,
        .entry = entry, .entry_size = buf + frame_end - entry, .entry_id = add->entry_id, .lac = add->lac,
        .ledger_id = (uint64_t)ledger_id, .master_key = frame + 4, .recovery = (frame[3] & V2_RECOVERY_ADD) != 0,
        /* no txnId; V2 carries no writer epoch: its adds are of epoch 0, as the generic path applies them */
    };
    return 1;
}

static const uint8_t ADD_HEADER[] = {0x08, 0x03, 0x10, 0x02, 0x18}; /* version 3, ADD_ENTRY, the txnId's tag */

/* A V3 ADD byte for byte as bkwire.AddRequestEncoder lays it out (Request: header of version, operation and txnId;
 * AddRequest: ledgerId, masterKey, [flag RECOVERY_ADD], writerEpoch, entryId, body), every varint as protobuf
 * writes it but the txnId's (echoed as it came), ids and epoch at most INT64_MAX, the entry header naming the same
 * ledger and entry, its lac >= -1. */
static int parse_v3(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Add *add) {
    Py_ssize_t frame_end = whole_frame(buf, pos, end, &add->length);
    if (frame_end == 0) return 0;
    const uint8_t *p = buf + pos + 4, *limit = buf + frame_end;
    uint64_t header_size, message_size, ledger_id, writer_epoch, entry_id, entry_size, txn_id;
    if (limit - p < 2 + (Py_ssize_t)sizeof ADD_HEADER || p[0] != 0x0A) return 0;
    header_size = p[1];
    if (memcmp(p + 2, ADD_HEADER, sizeof ADD_HEADER) != 0) return 0;
    p += 2 + sizeof ADD_HEADER;
    const uint8_t *txn = p;
    Py_ssize_t txn_size = read_varint(p, limit, 10, 0, &txn_id);
    if (txn_size == 0 || (txn_size == 10 && txn[9] > 1) || header_size != (uint64_t)(sizeof ADD_HEADER + txn_size))
        return 0;
    p += txn_size;
    if (limit - p < 2 || p[0] != 0xAA || p[1] != 0x06) return 0; /* Request.addRequest, field 101 */
    p += 2;
    Py_ssize_t size = read_varint(p, limit, 4, 1, &message_size);
    if (size == 0) return 0;
    p += size;
    if (message_size != (uint64_t)(limit - p)) return 0;
    const uint8_t *writer = p;
    if (p >= limit || *p++ != 0x08) return 0; /* ledgerId */
    if ((size = read_varint(p, limit, 9, 1, &ledger_id)) == 0) return 0;
    p += size;
    if (limit - p < 2 + MASTER_KEY_SIZE || p[0] != 0x1A || p[1] != MASTER_KEY_SIZE) return 0; /* masterKey */
    const uint8_t *master_key = p + 2;
    p += 2 + MASTER_KEY_SIZE;
    int recovery = limit - p >= 3 && p[0] == 0xA0 && p[1] == 0x06 && p[2] == 0x01; /* flag 100: RECOVERY_ADD */
    p += recovery ? 3 : 0;
    if (limit - p < 2 || p[0] != 0xC0 || p[1] != 0x3E) return 0; /* writerEpoch, field 1000 */
    p += 2;
    if ((size = read_varint(p, limit, 9, 1, &writer_epoch)) == 0) return 0;
    p += size;
    Py_ssize_t writer_size = p - writer;
    if (p >= limit || *p++ != 0x10) return 0; /* entryId */
    if ((size = read_varint(p, limit, 9, 1, &entry_id)) == 0) return 0;
    p += size;
    if (p >= limit || *p++ != 0x22) return 0; /* body */
    if ((size = read_varint(p, limit, 4, 1, &entry_size)) == 0) return 0;
    p += size;
    if (entry_size != (uint64_t)(limit - p) || entry_size < ENTRY_HEADER_SIZE) return 0;
    int64_t header_entry_id = (int64_t)be64(p + 8), lac = (int64_t)be64(p + 16);
    if (be64(p) != ledger_id || header_entry_id < 0 || (uint64_t)header_entry_id != entry_id || lac < -1) return 0;
    *add = (Add){
        .length = add->length, .frame_end = frame_end, .writer = writer, .writer_size = writer_size, .txn = txn,
        .txn_size = txn_size, .entry = p, .entry_size = (Py_ssize_t)entry_size, .entry_id = header_entry_id,
        .lac = lac, .ledger_id = ledger_id, .writer_epoch = writer_epoch, .master_key = master_key,
        .recovery = recovery,
    };
    return 1;
}

typedef int (*Parser)(const uint8_t *, Py_ssize_t, Py_ssize_t, Add *);

/* The buffer and the bounds every reading call takes: (v3, buffer, pos, end, ...). */
static int reading_args(PyObject *const *args, Py_buffer *view, Parser *parse, Py_ssize_t *pos, Py_ssize_t *end) {
    int v3 = PyObject_IsTrue(args[0]);
    if (v3 < 0) return 0;
    *parse = v3 ? parse_v3 : parse_v2;
    if (PyObject_GetBuffer(args[1], view, PyBUF_SIMPLE) < 0) return 0;
    *pos = PyLong_AsSsize_t(args[2]);
    *end = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred() || *pos < 0 || *pos > *end || *end > view->len) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "pos and end must lie in the buffer");
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(writer_of_doc,
"writer_of(v3, buffer, pos, end) -> (writer, ledger_id, master_key, recovery, writer_epoch) | None\n\n"
"The writer of the add framed at buffer[pos:end] if it reads in place (`writer`: the bytes every add of that writer\n"
"repeats), else None: the generic decoder decides it.");

static PyObject *writer_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    Parser parse;
    Py_ssize_t pos, end;
    Add add;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "writer_of takes (v3, buffer, pos, end)");
        return NULL;
    }
    if (!reading_args(args, &view, &parse, &pos, &end)) return NULL;
    PyObject *result = Py_None;
    if (parse(view.buf, pos, end, &add)) {
        result = Py_BuildValue(
            "(y#Ky#OK)", add.writer, add.writer_size, (unsigned long long)add.ledger_id, add.master_key,
            (Py_ssize_t)MASTER_KEY_SIZE, add.recovery ? Py_True : Py_False, (unsigned long long)add.writer_epoch);
    } else {
        Py_INCREF(result);
    }
    PyBuffer_Release(&view);
    return result;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

PyDoc_STRVAR(read_adds_doc,
"read_adds(v3, buffer, pos, end, writer, txns, entry_ids, lacs, entries, max_count, room) -> (pos, count, size)\n\n"
"Read the adds of `writer` (writer_of's bytes) framed one after another from buffer[pos:], as many as are whole and\n"
"read in place, at most `max_count`, the ones after the first only while their frame's length fits what `room`\n"
"leaves after the entries before them; append each one's txnId varint (b'' in V2), entry id, lac and entry to the\n"
"lists. The position after the last one read, how many, and their entries' bytes.");

static PyObject *read_adds(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    Parser parse;
    Py_ssize_t pos, end, writer_size, count = 0, size = 0;
    Add add;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "read_adds takes (v3, buffer, pos, end, writer, txns, entry_ids, lacs, entries, max_count, room)");
        return NULL;
    }
    PyObject *txns = args[5], *entry_ids = args[6], *lacs = args[7], *entries = args[8];
    if (!PyBytes_Check(args[4]) || !PyList_Check(txns) || !PyList_Check(entry_ids) || !PyList_Check(lacs) ||
        !PyList_Check(entries)) {
        PyErr_SetString(PyExc_TypeError, "read_adds takes the writer as bytes and four lists");
        return NULL;
    }
    const char *writer = PyBytes_AS_STRING(args[4]);
    writer_size = PyBytes_GET_SIZE(args[4]);
    Py_ssize_t max_count = PyLong_AsSsize_t(args[9]);
    long long room = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    if (!reading_args(args, &view, &parse, &pos, &end)) return NULL;
    const uint8_t *buf = view.buf;
    while (count < max_count && parse(buf, pos, end, &add)) {
        if (add.writer_size != writer_size || memcmp(add.writer, writer, writer_size) != 0) break;
        if (count > 0 && (long long)add.length > room - size) break;
        if (append_new(txns, PyBytes_FromStringAndSize((const char *)add.txn, add.txn_size)) < 0 ||
            append_new(entry_ids, PyLong_FromLongLong(add.entry_id)) < 0 ||
            append_new(lacs, PyLong_FromLongLong(add.lac)) < 0 ||
            append_new(entries, PyBytes_FromStringAndSize((const char *)add.entry, add.entry_size)) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        size += add.entry_size;
        count++;
        pos = add.frame_end;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnn)", pos, count, size);
}

static inline uint8_t *put_be32(uint8_t *out, uint32_t value) {
    out[0] = value >> 24;
    out[1] = value >> 16;
    out[2] = value >> 8;
    out[3] = value;
    return out + 4;
}

static inline uint8_t *put_be64(uint8_t *out, uint64_t value) {
    for (int i = 7; i >= 0; i--) *out++ = value >> (8 * i);
    return out;
}

static inline uint8_t *put_varint(uint8_t *out, uint64_t value) {
    while (value > 0x7F) {
        *out++ = (value & 0x7F) | 0x80;
        value >>= 7;
    }
    *out++ = value;
    return out;
}

static inline int varint_size(uint64_t value) {
    int size = 1;
    while (value > 0x7F) {
        value >>= 7;
        size++;
    }
    return size;
}

/* The entry ids of a run as int64s (a negative one, as protobuf does, a 10-byte varint in V3). */
static int64_t *int64s(PyObject *list, Py_ssize_t count) {
    int64_t *values = PyMem_Malloc(count ? count * sizeof(int64_t) : 1);
    if (values == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        values[i] = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
        if (values[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(values);
            return NULL;
        }
    }
    return values;
}

#define V2_ANSWER_SIZE 28 /* length prefix, header, rc, ledger id, entry id: bkwire.V2_RESPONSE */

PyDoc_STRVAR(encode_v2_add_acks_doc,
"encode_v2_add_acks(ledger_id, entry_ids) -> bytes\n\n"
"The OK answers of V2 adds to one ledger, as bkwire.encode_v2_response lays each out.");

static PyObject *encode_v2_add_acks(PyObject *module, PyObject *args) {
    long long ledger_id;
    PyObject *entry_ids;
    if (!PyArg_ParseTuple(args, "LO!", &ledger_id, &PyList_Type, &entry_ids)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(entry_ids);
    int64_t *ids = int64s(entry_ids, count);
    if (ids == NULL) return NULL;
    PyObject *acks = PyBytes_FromStringAndSize(NULL, count * V2_ANSWER_SIZE);
    if (acks != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(acks);
        for (Py_ssize_t i = 0; i < count; i++) {
            out = put_be32(out, V2_ANSWER_SIZE - 4);
            out = put_be32(out, (uint32_t)V2_VERSION << 24 | V2_ADD << 16);
            out = put_be32(out, 0); /* EOK */
            out = put_be64(out, (uint64_t)ledger_id);
            out = put_be64(out, (uint64_t)ids[i]);
        }
    }
    PyMem_Free(ids);
    return acks;
}

static const uint8_t OK_ADD_ANSWER[] = {0x10, 0x00, 0xAA, 0x06}; /* the EOK status, Response.addResponse's tag */

PyDoc_STRVAR(encode_v3_add_acks_doc,
"encode_v3_add_acks(ledger_id, txns, entry_ids) -> bytes\n\n"
"The OK answer frames of adds to one ledger given by their txnIds' varints (up to 10 bytes) and entry ids, as\n"
"protobuf lays each Response out: a bookie answers the adds of one writer and one group commit together.");

static PyObject *encode_v3_add_acks(PyObject *module, PyObject *args) {
    long long ledger_id;
    PyObject *txns, *entry_ids;
    if (!PyArg_ParseTuple(args, "LO!O!", &ledger_id, &PyList_Type, &txns, &PyList_Type, &entry_ids)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(txns);
    if (PyList_GET_SIZE(entry_ids) != count) {
        PyErr_SetString(PyExc_ValueError, "encode_v3_add_acks needs as many entry ids as txnIds");
        return NULL;
    }
    int64_t *ids = int64s(entry_ids, count);
    if (ids == NULL) return NULL;
    /* the AddResponse's status and ledger id, then the entry id's tag: the same for every answer */
    uint8_t ledger_part[15] = {0x08, 0x00, 0x10};
    uint8_t *ledger_end = put_varint(ledger_part + 3, (uint64_t)ledger_id);
    *ledger_end++ = 0x18;
    Py_ssize_t ledger_size = ledger_end - ledger_part, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *txn = PyList_GET_ITEM(txns, i);
        if (!PyBytes_Check(txn) || PyBytes_GET_SIZE(txn) < 1 || PyBytes_GET_SIZE(txn) > 10) {
            PyErr_SetString(PyExc_ValueError, "a txnId is the bytes of a varint of 1 to 10 bytes");
            PyMem_Free(ids);
            return NULL;
        }
        total += 4 + 2 + sizeof ADD_HEADER + PyBytes_GET_SIZE(txn) + sizeof OK_ADD_ANSWER + 1 + ledger_size +
                 varint_size((uint64_t)ids[i]);
    }
    PyObject *acks = PyBytes_FromStringAndSize(NULL, total);
    if (acks != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(acks);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *txn = PyList_GET_ITEM(txns, i);
            Py_ssize_t txn_size = PyBytes_GET_SIZE(txn);
            Py_ssize_t answer_size = ledger_size + varint_size((uint64_t)ids[i]); /* < 128: one byte */
            out = put_be32(out, (uint32_t)(12 + txn_size + answer_size));
            *out++ = 0x0A; /* the header */
            *out++ = (uint8_t)(sizeof ADD_HEADER + txn_size);
            memcpy(out, ADD_HEADER, sizeof ADD_HEADER);
            out += sizeof ADD_HEADER;
            memcpy(out, PyBytes_AS_STRING(txn), txn_size);
            out += txn_size;
            memcpy(out, OK_ADD_ANSWER, sizeof OK_ADD_ANSWER);
            out += sizeof OK_ADD_ANSWER;
            *out++ = (uint8_t)answer_size;
            memcpy(out, ledger_part, ledger_size);
            out = put_varint(out + ledger_size, (uint64_t)ids[i]);
        }
    }
    PyMem_Free(ids);
    return acks;
}

static PyMethodDef methods[] = {
    {"writer_of", (PyCFunction)(void (*)(void))writer_of, METH_FASTCALL, writer_of_doc},
    {"read_adds", (PyCFunction)(void (*)(void))read_adds, METH_FASTCALL, read_adds_doc},
    {"encode_v2_add_acks", encode_v2_add_acks, METH_VARARGS, encode_v2_add_acks_doc},
    {"encode_v3_add_acks", encode_v3_add_acks, METH_VARARGS, encode_v3_add_acks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bookfleet._bookieadds",
    "The bookie's per-entry add loop: adds read in place, acks encoded (bkwire re-exports it).", -1, methods,
};

PyMODINIT_FUNC PyInit__bookieadds(void) { return PyModule_Create(&module); }
