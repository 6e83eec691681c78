/* The entry log's per-entry append loop (entrylog.py is the only module that imports it): one ledger's entries laid
 * out as entry-log records, `length u32 | ledger u64 | entry i64 | entry bytes` (entrylog.RECORD_HEADER, big-endian),
 * in one buffer, with where each entry's bytes land.
 *
 * It exists because the profile proved this loop dominant (docs/design.md): in Python a flush cost ~10k instructions
 * per entry, a generator step, a struct pack, two list appends and a row tuple among them, all holding the GIL. Here
 * the per-entry work under the GIL is reading each entry's id and size and taking a reference to it; the bytes are
 * copied with the GIL released where they are many (the references keep every entry alive and bytes are
 * immutable). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define RECORD_HEADER_SIZE 20 /* length u32, ledger u64, entry i64 */
#define GIL_FREE_COPY_BYTES (64 * 1024)
/* Copies at least this long are made with the GIL released: a shorter one takes less time than handing the GIL over
 * and waiting to get it back. */

typedef struct {
    PyObject *entry; /* a reference held while the GIL is released */
    int64_t entry_id;
    uint32_t size;
} Record;

static void put_be32(uint8_t *out, uint32_t value) {
    for (int i = 3; i >= 0; i--, value >>= 8) out[i] = (uint8_t)value;
}

static void put_be64(uint8_t *out, uint64_t value) {
    for (int i = 7; i >= 0; i--, value >>= 8) out[i] = (uint8_t)value;
}

static void put_le32(uint8_t *out, uint32_t value) {
    for (int i = 0; i < 4; i++, value >>= 8) out[i] = (uint8_t)value;
}

static void put_le64(uint8_t *out, uint64_t value) {
    for (int i = 0; i < 8; i++, value >>= 8) out[i] = (uint8_t)value;
}

PyDoc_STRVAR(pack_records_doc,
"pack_records(ledger_id, entry_ids, entries, offset, limit) -> (records, count, offsets, sizes, total)\n\n"
"The records of the first `count` entries (lists of ints and of bytes, of one length) written at `offset` of a\n"
"log: an entry is packed only while the offset it would start at is below `limit` (where the log rolls), so\n"
"`count` may be 0. `offsets` holds each packed entry's bytes' offset (u64) and `sizes` its size (u32), little-\n"
"endian; `total` is the sum of the sizes.");

static PyObject *pack_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "pack_records takes 5 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *ids = args[1], *entries = args[2];
    if (!PyList_Check(ids) || !PyList_Check(entries) || PyList_GET_SIZE(ids) != PyList_GET_SIZE(entries)) {
        PyErr_SetString(PyExc_TypeError, "pack_records needs lists of entry ids and of entries of one length");
        return NULL;
    }
    uint64_t ledger_id = PyLong_AsUnsignedLongLong(args[0]);
    if (ledger_id == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    long long start = PyLong_AsLongLong(args[3]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    long long limit = PyLong_AsLongLong(args[4]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    Record *records = PyMem_Malloc(sizeof(Record) * (size_t)(n ? n : 1));
    if (records == NULL) return PyErr_NoMemory();
    Py_ssize_t count = 0;
    long long offset = start;
    uint64_t total = 0;
    for (; count < n && offset < limit; count++) {
        PyObject *entry = PyList_GET_ITEM(entries, count);
        if (!PyBytes_Check(entry)) {
            PyErr_Format(PyExc_TypeError, "entry %zd is %.100s, not bytes", count, Py_TYPE(entry)->tp_name);
            goto fail;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(entry);
        if ((uint64_t)size > UINT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "entry %zd of %zd bytes does not fit a record's length", count, size);
            goto fail;
        }
        long long entry_id = PyLong_AsLongLong(PyList_GET_ITEM(ids, count));
        if (entry_id == -1 && PyErr_Occurred()) goto fail;
        Py_INCREF(entry);
        records[count] = (Record){entry, entry_id, (uint32_t)size};
        offset += RECORD_HEADER_SIZE + size;
        total += (uint64_t)size;
    }
    PyObject *packed = PyBytes_FromStringAndSize(NULL, offset - start);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, 8 * count);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, 4 * count);
    PyObject *result = NULL;
    if (packed != NULL && offsets != NULL && sizes != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(packed);
        uint8_t *offset_out = (uint8_t *)PyBytes_AS_STRING(offsets), *size_out = (uint8_t *)PyBytes_AS_STRING(sizes);
        PyThreadState *released = offset - start >= GIL_FREE_COPY_BYTES ? PyEval_SaveThread() : NULL;
        uint64_t at = (uint64_t)start;
        for (Py_ssize_t i = 0; i < count; i++) {
            Record *record = &records[i];
            put_be32(out, record->size);
            put_be64(out + 4, ledger_id);
            put_be64(out + 12, (uint64_t)record->entry_id);
            memcpy(out + RECORD_HEADER_SIZE, PyBytes_AS_STRING(record->entry), record->size);
            out += RECORD_HEADER_SIZE + record->size;
            at += RECORD_HEADER_SIZE;
            put_le64(offset_out + 8 * i, at);
            put_le32(size_out + 4 * i, record->size);
            at += record->size;
        }
        if (released != NULL) PyEval_RestoreThread(released);
        result = Py_BuildValue("(NnNNK)", packed, count, offsets, sizes, (unsigned long long)total);
        packed = offsets = sizes = NULL; /* the tuple owns them, or Py_BuildValue released them */
    }
    Py_XDECREF(packed);
    Py_XDECREF(offsets);
    Py_XDECREF(sizes);
    for (Py_ssize_t i = 0; i < count; i++) Py_DECREF(records[i].entry);
    PyMem_Free(records);
    return result;
fail:
    for (Py_ssize_t i = 0; i < count; i++) Py_DECREF(records[i].entry);
    PyMem_Free(records);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_records", (PyCFunction)(void (*)(void))pack_records, METH_FASTCALL, pack_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bookfleet._entrylog",
    "The entry log's per-entry append loop: one ledger's records packed into one buffer (entrylog.py uses it).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__entrylog(void) { return PyModule_Create(&module); }
