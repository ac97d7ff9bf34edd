/*
 * libstore._codec: the record codec's hot loops in C (check a CommitLog record, adopt a run of
 * client-encoded records). The layout is RocketMQ's v1/v2 record as drawn in record_codec.py.
 *
 * Every function here is a fast path of a pure-Python function in libstore/record_codec.py and
 * answers exactly as it does; anything off the common path (a system topic's properties, a record
 * the checks refuse, a topic not seen yet in a batch, odd arguments) is handed back to the Python
 * code, which stays the reference. tests/unit/libstore/test_codec_ext.py compares the two byte for
 * byte. MQSTORE_PURE_PYTHON=1 in the environment makes record_codec.py ignore this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: how __slots__ are stored */
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MAGIC_BLANK ((int32_t)0xCBD43194)
#define MIN_BLANK 8
#define RECORD_OVERHEAD_V1_IPV4 91
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20
#define TX_NO_QUEUE_OFFSET 0x4 /* PREPARED 0x4 and ROLLBACK 0xC share it */
#define TRANSIENT_STUB 0x100000 /* MessageSysFlag.TRANSIENT_STUB_FLAG (libstore.durability) */
#define SYS_FLAG_POSITION 36
#define QUEUE_ID_POSITION 12
#define BORN_TS_POSITION 40
#define BORN_HOST_POSITION 48

/* DispatchRequest's slots, in the order of its __init__ parameters. */
enum {
    F_SUCCESS, F_MSG_SIZE, F_TOPIC, F_QUEUE_ID, F_COMMIT_LOG_OFFSET, F_CONSUME_QUEUE_OFFSET,
    F_SYS_FLAG, F_BORN_TIMESTAMP, F_STORE_TIMESTAMP, F_PREPARED_TX_OFFSET, F_TAGS, F_TAGS_CODE,
    F_KEYS, F_UNIQ_KEY, F_SCHEDULED, F_TRACE_CONTEXT, F_COUNT
};
static const char *const FIELD_NAMES[F_COUNT] = {
    "success", "msg_size", "topic", "queue_id", "commit_log_offset", "consume_queue_offset",
    "sys_flag", "born_timestamp", "store_timestamp", "prepared_transaction_offset", "tags",
    "tags_code", "keys", "uniq_key", "scheduled", "trace_context",
};

typedef struct {
    PyTypeObject *request_type; /* libstore.record_codec.DispatchRequest */
    PyObject *descr[F_COUNT];   /* its member descriptors */
    Py_ssize_t slot_at[F_COUNT]; /* where each slot's pointer sits in an instance (its __slots__) */
    PyObject *system_codes;     /* dict str -> bytes | None: system_topics.SYSTEM_CODE_PROPERTIES */
    PyObject *topic_names;      /* dict bytes -> str */
    PyObject *empty_tuple;
    PyObject *empty_str;
    PyObject *space;
    PyObject *crc_func; /* crc32(bytes-like) -> int, or NULL for zlib */
    /* A C function computing zlib's crc32 (ISA-L's crc32_gzip_refl, found in the isal wheel:
     * record_codec), or NULL: then crc_func, called through Python, or zlib. */
    uint32_t (*crc_native)(uint32_t crc, const unsigned char *buf, uint64_t len);
    PyObject *array_type; /* array.array */
    PyObject *typecode_q; /* "q" */
    PyObject *n_toreadonly; /* "toreadonly" */
    PyTypeObject *record_type; /* libstore.message.MessageRecord, or NULL */
    Py_ssize_t record_slot_at[18]; /* where each MessageRecord field sits in an instance */
    PyObject *decode_host; /* encoded host bytes -> (ip, port) */
    PyObject *n_topic, *n_body, *n_queue_id, *n_properties, *n_born_host, *n_sys_flag, *n_flag,
        *n_born_timestamp, *n_reconsume_times, *n_prepared_transaction_offset; /* attribute names */
    int configured;
} State;

static State S;

static inline int32_t rd32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline int16_t rd16(const unsigned char *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline int64_t rd64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)rd32(p) << 32) | (uint32_t)rd32(p + 4));
}
static inline void wr32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8); p[3] = (unsigned char)u;
}
static inline void wr64(unsigned char *p, int64_t v) {
    wr32(p, (int32_t)((uint64_t)v >> 32));
    wr32(p + 4, (int32_t)(uint64_t)v);
}

/* list.append(index) for a list of indexes or offsets; 0, or -1 with an exception set. */
static int append_index(PyObject *list, Py_ssize_t index) {
    PyObject *i_obj = PyLong_FromSsize_t(index);
    int rc = (i_obj != NULL && PyList_Append(list, i_obj) == 0) ? 0 : -1;
    Py_XDECREF(i_obj);
    return rc;
}

/* array.array('q', values[:n]) (native byte order, as array stores it); NULL with an exception set. */
static PyObject *int64_array(const int64_t *values, Py_ssize_t n) {
    PyObject *raw = PyBytes_FromStringAndSize((const char *)values, n * (Py_ssize_t)sizeof(int64_t));
    if (raw == NULL) return NULL;
    PyObject *arr = PyObject_CallFunctionObjArgs(S.array_type, S.typecode_q, raw, NULL);
    Py_DECREF(raw);
    return arr;
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) { /* zlib takes an unsigned int length */
        unsigned int step = n > 0x40000000 ? 0x40000000u : (unsigned int)n;
        crc = crc32(crc, p, step);
        p += step;
        n -= step;
    }
    return (uint32_t)crc;
}

/* ---------------------------------------------------------------- header */

typedef struct {
    int32_t total, magic, body_crc, queue_id, flag, sys_flag, reconsume, body_len;
    int64_t queue_offset, phy_offset, born_ts, store_ts, prepared_tx;
    Py_ssize_t born_at, born_len, store_at, store_len, header_size;
} Header;

static void read_header(const unsigned char *r, Header *h) {
    h->total = rd32(r);
    h->magic = rd32(r + 4);
    h->body_crc = rd32(r + 8);
    h->queue_id = rd32(r + 12);
    h->flag = rd32(r + 16);
    h->queue_offset = rd64(r + 20);
    h->phy_offset = rd64(r + 28);
    h->sys_flag = rd32(r + 36);
    h->born_ts = rd64(r + 40);
    h->born_at = 48;
    h->born_len = (h->sys_flag & BORNHOST_V6) ? 20 : 8;
    Py_ssize_t p = 48 + h->born_len;
    h->store_ts = rd64(r + p);
    h->store_at = p + 8;
    h->store_len = (h->sys_flag & STOREHOST_V6) ? 20 : 8;
    p = h->store_at + h->store_len;
    h->reconsume = rd32(r + p);
    h->prepared_tx = rd64(r + p + 4);
    h->body_len = rd32(r + p + 12);
    h->header_size = p + 16;
}

/* The fixed header as record_codec's struct unpacks it (TOTALSIZE .. BODYLEN). */
static PyObject *header_tuple(const unsigned char *r, const Header *h) {
    return Py_BuildValue(
        "(iiiiiLLiLy#Ly#iLi)", h->total, h->magic, h->body_crc, h->queue_id, h->flag,
        (long long)h->queue_offset, (long long)h->phy_offset, h->sys_flag, (long long)h->born_ts,
        (const char *)r + h->born_at, h->born_len, (long long)h->store_ts,
        (const char *)r + h->store_at, h->store_len, h->reconsume, (long long)h->prepared_tx,
        h->body_len);
}

static int as_int(PyObject *obj, long long lo, long long hi, long long *out) {
    /* an exact int within [lo, hi]; 0 otherwise (no exception left set) */
    if (obj == NULL || !PyLong_CheckExact(obj)) {
        PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()) || v < lo || v > hi) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* libstore.queue_round_robin.QueueRoundRobin, a dict of {topic: next message number}: the queue
 * of ``topic``'s next message over ``width`` queues, the counter bumped, no Python run. -1 with
 * an exception set on failure; -2 (nothing changed) when the counter is not a plain int, for the
 * caller to call the object instead. */
static long long round_robin_next(PyObject *counters, PyObject *topic, long long width) {
    PyObject *cur = PyDict_GetItemWithError(counters, topic);
    long long n = 0;
    if (cur == NULL) {
        if (PyErr_Occurred()) return -1;
    } else if (!as_int(cur, 0, INT64_MAX - 1, &n)) {
        return -2;
    }
    PyObject *next = PyLong_FromLongLong(n + 1);
    if (next == NULL) return -1;
    int rc = PyDict_SetItem(counters, topic, next);
    Py_DECREF(next);
    return rc < 0 ? -1 : n % width;
}

/* ------------------------------------------------------------ properties */

/* Java String.hashCode over the UTF-16 code units of ``text`` (libstore.tags, spec §3). */
static long java_hash(PyObject *text) {
    uint32_t h = 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31u * h + (0xD800u + (c >> 10));
            h = 31u * h + (0xDC00u + (c & 0x3FF));
        } else {
            h = 31u * h + c;
        }
    }
    return (long)(int32_t)h;
}

/* What dispatch reads from the properties: the value ranges of TAGS, KEYS, UNIQ_KEY (the last
 * entry of each name wins, as in record_codec's regex) and whether a scheduling name appears;
 * and for the put, whether the message waits for the store (WAIT, the last entry wins). */
typedef struct {
    const unsigned char *tags, *keys, *uniq, *trace;
    Py_ssize_t tags_len, keys_len, uniq_len, trace_len;
    int scheduled;
    int no_wait;
    int durability; /* a DURABILITY entry is there (libstore.durability reads its value) */
    const unsigned char *durability_value; /* the last one's */
    Py_ssize_t durability_len;
    const unsigned char *wanted; /* the last entry of the name the caller asked for, or NULL */
    Py_ssize_t wanted_len;
} Found;

static int name_is(const unsigned char *p, Py_ssize_t n, const char *name) {
    size_t len = strlen(name);
    return (Py_ssize_t)len == n && memcmp(p, name, len) == 0;
}

/* Whether the UTF-8 text p[0..n) is "true" in any letter case: how RocketMQ reads a boolean
 * property (Java's Boolean.parseBoolean; libstore.message.waits_for_store for WAIT). */
static int is_true_text(const void *p, Py_ssize_t n) {
    static const char want[4] = {'t', 'r', 'u', 'e'};
    const unsigned char *c = p;
    if (n != 4) return 0;
    for (int i = 0; i < 4; i++) {
        unsigned char lower = (c[i] >= 'A' && c[i] <= 'Z') ? (unsigned char)(c[i] + 32) : c[i];
        if (lower != (unsigned char)want[i]) return 0;
    }
    return 1;
}

/* One pass over the properties p[0..n) filling ``f``; ``want`` (``want_len`` bytes, or NULL) is
 * one more name to find (a system topic's tags-code property), whichever other it is. */
static void find_properties(const unsigned char *p, Py_ssize_t n, const char *want, Py_ssize_t want_len,
                            Found *f) {
    memset(f, 0, sizeof(*f));
    f->tags_len = f->keys_len = f->uniq_len = f->trace_len = -1;
    Py_ssize_t i = 0;
    while (i <= n) {
        /* one entry: p[i .. e), e at the next \x02 or the end */
        const unsigned char *start = p + i;
        const unsigned char *stop = memchr(start, 0x02, (size_t)(n - i));
        Py_ssize_t e = stop ? (Py_ssize_t)(stop - p) : n;
        const unsigned char *sep = memchr(start, 0x01, (size_t)(e - i));
        if (sep != NULL) {
            Py_ssize_t name_len = sep - start;
            const unsigned char *value = sep + 1;
            Py_ssize_t value_len = (p + e) - value;
            if (want != NULL && name_len == want_len && memcmp(start, want, (size_t)want_len) == 0) {
                f->wanted = value;
                f->wanted_len = value_len;
            }
            if (name_is(start, name_len, "TAGS")) {
                f->tags = value; f->tags_len = value_len;
            } else if (name_is(start, name_len, "KEYS")) {
                f->keys = value; f->keys_len = value_len;
            } else if (name_is(start, name_len, "UNIQ_KEY")) {
                f->uniq = value; f->uniq_len = value_len;
            } else if (name_is(start, name_len, "DELAY") || name_is(start, name_len, "TIMER_DELIVER_MS")
                       || name_is(start, name_len, "TIMER_DELAY_SEC")
                       || name_is(start, name_len, "TIMER_DELAY_MS")) {
                f->scheduled = 1;
            } else if (name_is(start, name_len, "WAIT") && value_len > 0) { /* an empty one is dropped */
                f->no_wait = !is_true_text(value, value_len);
            } else if (name_is(start, name_len, "DURABILITY") && value_len > 0) { /* as WAIT */
                f->durability = 1;
                f->durability_value = value;
                f->durability_len = value_len;
            } else if (name_is(start, name_len, "traceparent")) {
                f->trace = value; f->trace_len = value_len;
            }
        }
        if (stop == NULL) break;
        i = e + 1;
    }
}

/* ``p[0..n)`` as system_topics._number reads a property value: 1 to 19 ASCII digits, capped at
 * 2**63 - 1; 0 for no value (NULL) or anything else. */
static long long ascii_number(const unsigned char *p, Py_ssize_t n) {
    if (p == NULL || n < 1 || n > 19) return 0;
    unsigned long long v = 0; /* 19 digits stay below 2**64 */
    for (Py_ssize_t k = 0; k < n; k++) {
        if (p[k] < '0' || p[k] > '9') return 0;
        v = v * 10 + (unsigned long long)(p[k] - '0');
    }
    return v > (unsigned long long)LLONG_MAX ? LLONG_MAX : (long long)v;
}

static int is_ascii(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] & 0x80) return 0;
    }
    return 1;
}

/* record_codec._properties_look_written: ends with \x02, no NUL, valid UTF-8. -1 on error. */
static int look_written(const unsigned char *p, Py_ssize_t n) {
    if (n == 0 || p[n - 1] != 0x02 || memchr(p, 0, (size_t)n) != NULL) return 0;
    if (is_ascii(p, n)) return 1;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(text);
    return 1;
}

/* record_codec._properties_problem's verdict: 0 when fine, 1 when not (the Python code words
 * the error), -1 on a Python error. */
static int properties_bad(const unsigned char *p, Py_ssize_t n) {
    if (!is_ascii(p, n)) {
        PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
            PyErr_Clear();
            return 1;
        }
        Py_DECREF(text);
    }
    if (n == 0 || p[n - 1] != 0x02) return 1;
    Py_ssize_t i = 0;
    while (i < n) { /* entries of p[0 .. n-1), each "name \x01 value" with one \x01, name not empty */
        const unsigned char *stop = memchr(p + i, 0x02, (size_t)(n - i));
        Py_ssize_t e = (Py_ssize_t)(stop - p); /* found: p[n-1] is \x02 */
        int ones = 0;
        for (Py_ssize_t k = i; k < e; k++) ones += p[k] == 0x01;
        if (ones != 1 || p[i] == 0x01) return 1;
        i = e + 1;
    }
    return 0;
}

/* Whether a producer's properties name one the store sets (libstore.producer_input): the names
 * that record_codec.bytes_to_properties would return (pieces of >= 3 characters split at the
 * first \x01, name and value not empty). 1 yes, 0 no, -1 error. Only called on valid UTF-8. */
static int names_forbidden(const unsigned char *p, Py_ssize_t n, PyObject *forbidden) {
    Py_ssize_t i = 0;
    while (i < n) {
        const unsigned char *stop = memchr(p + i, 0x02, (size_t)(n - i));
        Py_ssize_t e = stop ? (Py_ssize_t)(stop - p) : n;
        const unsigned char *sep = memchr(p + i, 0x01, (size_t)(e - i));
        if (sep != NULL && sep > p + i && sep + 1 < p + e) {
            /* pieces shorter than 3 characters cannot have both a name and a value */
            PyObject *name = PyUnicode_DecodeUTF8((const char *)p + i, sep - (p + i), "replace");
            if (name == NULL) return -1;
            int hit = PySet_Contains(forbidden, name);
            Py_DECREF(name);
            if (hit != 0) return hit;
        }
        i = e + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- check */

static PyObject *topic_name(const unsigned char *p, Py_ssize_t n) {
    PyObject *raw = PyBytes_FromStringAndSize((const char *)p, n);
    if (raw == NULL) return NULL;
    PyObject *name = PyDict_GetItemWithError(S.topic_names, raw);
    if (name != NULL) {
        Py_DECREF(raw);
        Py_INCREF(name);
        return name;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(raw);
        return NULL;
    }
    name = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (name == NULL) {
        Py_DECREF(raw);
        return NULL; /* UnicodeDecodeError: the caller turns it into "not a record" */
    }
    if (PyDict_GET_SIZE(S.topic_names) > 10000) PyDict_Clear(S.topic_names);
    if (PyDict_SetItem(S.topic_names, raw, name) < 0) {
        Py_DECREF(raw);
        Py_DECREF(name);
        return NULL;
    }
    Py_DECREF(raw);
    return name;
}

/* Set a slot of a DispatchRequest to a new reference to ``value``: where __slots__ keep it when
 * ``req`` is exactly S.request_type (configure checked the offsets), else through its member
 * descriptor. Returns -1 with an exception set on failure. */
static inline int req_set(PyObject *req, int field, PyObject *value) {
    if (Py_TYPE(req) != S.request_type) {
        PyObject *d = S.descr[field];
        return Py_TYPE(d)->tp_descr_set(d, req, value);
    }
    PyObject **slot = (PyObject **)((char *)req + S.slot_at[field]);
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

/* A DispatchRequest from its slot values (new references, stolen; NULL where the __init__
 * default applies). Returns NULL with an exception set on failure (values released). */
static PyObject *build_request(PyObject *values[F_COUNT]) {
    PyObject *req = S.request_type->tp_alloc(S.request_type, 0);
    int rc = req == NULL ? -1 : 0;
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *v = values[i];
        if (v == NULL && rc == 0) {
            switch (i) {
            case F_TOPIC: v = Py_NewRef(S.empty_str); break;
            case F_COMMIT_LOG_OFFSET: v = PyLong_FromLong(-1); break;
            case F_TAGS: case F_UNIQ_KEY: case F_TRACE_CONTEXT: v = Py_NewRef(Py_None); break;
            case F_KEYS: v = PyTuple_New(0); break;  /* the shared empty tuple */
            case F_SUCCESS: case F_SCHEDULED: v = Py_NewRef(Py_False); break;
            default: v = PyLong_FromLong(0); break;
            }
            if (v == NULL) rc = -1;
        }
        if (rc == 0) rc = req_set(req, i, v);
        Py_XDECREF(v);
    }
    if (rc < 0) {
        Py_XDECREF(req);
        return NULL;
    }
    return req;
}

static int set_field(PyObject *req, int field, PyObject *value /* stolen */) {
    if (value == NULL) return -1;
    int rc = req_set(req, field, value);
    Py_DECREF(value);
    return rc;
}

/* (request, fields, body_at, props_at) for a blank or bad bytes. */
static PyObject *refused(int success, long long msg_size) {
    PyObject *values[F_COUNT] = {NULL};
    values[F_SUCCESS] = PyBool_FromLong(success);
    values[F_MSG_SIZE] = PyLong_FromLongLong(msg_size);
    if (values[F_MSG_SIZE] == NULL) {
        Py_XDECREF(values[F_SUCCESS]);
        return NULL;
    }
    PyObject *req = build_request(values);
    if (req == NULL) return NULL;
    return Py_BuildValue("(NOii)", req, S.empty_tuple, -1, -1);
}

static PyObject *pack4(PyObject *req, PyObject *fields, Py_ssize_t body_at, Py_ssize_t props_at) {
    /* steals req and fields */
    PyObject *out = PyTuple_New(4);
    PyObject *a = PyLong_FromSsize_t(body_at), *b = PyLong_FromSsize_t(props_at);
    if (out == NULL || a == NULL || b == NULL) {
        Py_XDECREF(out); Py_XDECREF(a); Py_XDECREF(b); Py_DECREF(req); Py_DECREF(fields);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, req);
    PyTuple_SET_ITEM(out, 1, fields);
    PyTuple_SET_ITEM(out, 2, a);
    PyTuple_SET_ITEM(out, 3, b);
    return out;
}

/* CRC-32 of n bytes at p: the native function when set (no Python call: ~0.02 us a KiB), else
 * the configured Python one (ISA-L's, ~3x zlib's speed per KiB) or zlib. */
static int body_crc(const unsigned char *p, Py_ssize_t n, uint32_t *crc) {
    if (S.crc_native != NULL) {
        *crc = S.crc_native(0, p, (uint64_t)n);
        return 0;
    }
    if (S.crc_func == NULL || n < 64) {
        *crc = crc32_of(p, n);
        return 0;
    }
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) return -1;
    PyObject *v = PyObject_CallOneArg(S.crc_func, view);
    Py_DECREF(view);
    if (v == NULL) return -1;
    unsigned long u = PyLong_AsUnsignedLong(v);
    Py_DECREF(v);
    if (u == (unsigned long)-1 && PyErr_Occurred()) return -1;
    *crc = (uint32_t)u;
    return 0;
}

#define FALLBACK Py_NotImplemented

/* What adopt_run needs of a good record besides the request (borrowed references). */
typedef struct {
    Header header;
    Py_ssize_t props_at; /* stays -1 unless the record is good */
    Py_ssize_t body_at;
    PyObject *topic, *uniq_key; /* borrowed from the request; owned when no request is built */
    int scheduled;
    int no_wait; /* with a request: the WAIT property says not to wait for the store */
    int durability; /* with a request: a DURABILITY property is there */
} Checked;

/* The core of record_codec._check_record over the buffer ``buf`` (``limit`` <= its length).
 * Returns a new reference to the 4-tuple, NotImplemented (borrowed, FALLBACK) when the Python
 * code must answer, or NULL with an exception set. ``out`` (may be NULL) is filled for a good
 * record. */
static PyObject *check_one(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t limit, int check_crc,
                           long long expected_phy, int decode_props, int check_props, int want_fields,
                           Checked *out, int build) {
    Py_ssize_t remaining = limit - pos;
    if (remaining < MIN_BLANK) return refused(0, -1);
    const unsigned char *r = buf + pos;
    int32_t total = rd32(r), magic = rd32(r + 4);
    if (magic == MAGIC_BLANK) return refused(1, 0);
    int topic_len_size;
    if (magic == MAGIC_V1) topic_len_size = 1;
    else if (magic == MAGIC_V2) topic_len_size = 2;
    else return refused(0, -1);
    if (total < RECORD_OVERHEAD_V1_IPV4 || total > remaining) return refused(0, total);
    /* The 88 bytes of an all-IPv4 header are there (total >= 91); IPv6 hosts widen it: check
     * that the header fits the record before reading any of it past those 88 bytes. */
    int32_t flags0 = rd32(r + SYS_FLAG_POSITION);
    Py_ssize_t header_size = 72 + ((flags0 & BORNHOST_V6) ? 20 : 8) + ((flags0 & STOREHOST_V6) ? 20 : 8);
    if (header_size > total) return refused(0, total);
    Header h;
    read_header(r, &h);
    if (expected_phy >= 0 && expected_phy != h.phy_offset) return refused(0, total);
    Py_ssize_t body_at = h.header_size, end = total;
    if (h.body_len < 0 || body_at + (Py_ssize_t)h.body_len + topic_len_size + 2 > end) return refused(0, total);
    if (check_crc) {
        uint32_t crc;
        if (body_crc(r + body_at, h.body_len, &crc) < 0) return NULL;
        if ((int64_t)(crc & 0x7FFFFFFFu) != (int64_t)h.body_crc) return refused(0, total);
    }
    Py_ssize_t p = body_at + h.body_len;
    Py_ssize_t topic_len = topic_len_size == 1 ? (Py_ssize_t)r[p] : (Py_ssize_t)rd16(r + p);
    p += topic_len_size;
    if (topic_len <= 0 || p + topic_len + 2 > end) return refused(0, total);
    PyObject *topic = topic_name(r + p, topic_len);
    if (topic == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear();
        return refused(0, total);
    }
    p += topic_len;
    Py_ssize_t prop_len = rd16(r + p);
    p += 2;
    if (prop_len < 0 || p + prop_len != end) {
        Py_DECREF(topic);
        return refused(0, total);
    }
    if (check_props && prop_len) {
        int ok = look_written(r + p, prop_len);
        if (ok <= 0) {
            Py_DECREF(topic);
            return ok < 0 ? NULL : refused(0, total);
        }
    }
    /* A system topic's entry of SYSTEM_CODE_PROPERTIES (borrowed): its units' tags code comes
       from it, not from TAGS. Callers that build no request leave such records to Python. */
    PyObject *code_name = NULL;
    if (decode_props) {
        code_name = PyDict_GetItemWithError(S.system_codes, topic);
        if (code_name == NULL && PyErr_Occurred()) {
            Py_DECREF(topic);
            return NULL;
        }
        if (code_name != NULL && (!build || (code_name != Py_None && !PyBytes_Check(code_name)))) {
            Py_DECREF(topic);
            return FALLBACK;
        }
    }
    if (!build) { /* a good record, and the caller wants no request: Py_None, ``out`` filled */
        out->header = h;
        out->props_at = pos + p;
        out->body_at = pos + body_at;
        out->topic = topic; /* the caller owns it */
        return Py_NewRef(Py_None);
    }
    PyObject *values[F_COUNT] = {NULL};
    values[F_TOPIC] = topic; /* owned by values from here */
    int no_wait = 0, durability = 0;
    /* system_topics.system_tags_code: the store time, or the number in a property (0 without) */
    long long system_code = code_name == Py_None ? h.store_ts : 0;
    const char *want = NULL; /* b"": no property, the code is 0 */
    Py_ssize_t want_len = 0;
    if (code_name != NULL && code_name != Py_None && PyBytes_GET_SIZE(code_name) > 0) {
        want = PyBytes_AS_STRING(code_name);
        want_len = PyBytes_GET_SIZE(code_name);
    }
    if (decode_props && prop_len) {
        Found f;
        find_properties(r + p, prop_len, want, want_len, &f);
        if (want != NULL && f.wanted != NULL) system_code = ascii_number(f.wanted, f.wanted_len);
        no_wait = f.no_wait;
        durability = f.durability;
        if (f.tags_len > 0) {
            PyObject *tags = PyUnicode_DecodeUTF8((const char *)f.tags, f.tags_len, "replace");
            if (tags == NULL) goto error;
            values[F_TAGS] = tags;
            values[F_TAGS_CODE] = PyLong_FromLong(java_hash(tags));
            if (values[F_TAGS_CODE] == NULL) goto error;
        }
        if (f.keys_len > 0) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)f.keys, f.keys_len, "replace");
            if (text == NULL) goto error;
            /* A tuple: a tuple of strings leaves the garbage collector's lists (a list would
               be one more tracked object per record in every young collection). */
            PyObject *keys;
            if (memchr(f.keys, ' ', (size_t)f.keys_len) == NULL) {
                keys = PyTuple_New(1);
                if (keys == NULL) {
                    Py_DECREF(text);
                    goto error;
                }
                PyTuple_SET_ITEM(keys, 0, text);
            } else {
                PyObject *parts = PyUnicode_Split(text, S.space, -1);
                Py_DECREF(text);
                if (parts == NULL) goto error;
                Py_ssize_t n = PyList_GET_SIZE(parts), kept = 0;
                for (Py_ssize_t k = 0; k < n; k++) kept += PyUnicode_GET_LENGTH(PyList_GET_ITEM(parts, k)) > 0;
                keys = PyTuple_New(kept);  /* the non-empty parts, in order */
                for (Py_ssize_t k = 0, t = 0; keys != NULL && k < n; k++) {
                    PyObject *part = PyList_GET_ITEM(parts, k);
                    if (PyUnicode_GET_LENGTH(part)) PyTuple_SET_ITEM(keys, t++, Py_NewRef(part));
                }
                Py_DECREF(parts);
                if (keys == NULL) goto error;
            }
            values[F_KEYS] = keys;
        }
        if (f.uniq_len > 0) {
            values[F_UNIQ_KEY] = PyUnicode_DecodeUTF8((const char *)f.uniq, f.uniq_len, "replace");
            if (values[F_UNIQ_KEY] == NULL) goto error;
        }
        if (f.scheduled) values[F_SCHEDULED] = Py_NewRef(Py_True);
        if (f.trace_len > 0) {
            values[F_TRACE_CONTEXT] = PyUnicode_DecodeUTF8((const char *)f.trace, f.trace_len, "replace");
            if (values[F_TRACE_CONTEXT] == NULL) goto error;
        }
    }
    if (code_name != NULL) { /* a system topic: its code, not TAGS' hash */
        Py_XSETREF(values[F_TAGS_CODE], PyLong_FromLongLong(system_code));
        if (values[F_TAGS_CODE] == NULL) goto error;
    }
    values[F_SUCCESS] = Py_NewRef(Py_True);
    if ((values[F_MSG_SIZE] = PyLong_FromLong(total)) == NULL
        || (values[F_QUEUE_ID] = PyLong_FromLong(h.queue_id)) == NULL
        || (values[F_COMMIT_LOG_OFFSET] = PyLong_FromLongLong(h.phy_offset)) == NULL
        || (values[F_CONSUME_QUEUE_OFFSET] = PyLong_FromLongLong(h.queue_offset)) == NULL
        || (values[F_SYS_FLAG] = PyLong_FromLong(h.sys_flag)) == NULL
        || (values[F_BORN_TIMESTAMP] = PyLong_FromLongLong(h.born_ts)) == NULL
        || (values[F_STORE_TIMESTAMP] = PyLong_FromLongLong(h.store_ts)) == NULL
        || (values[F_PREPARED_TX_OFFSET] = PyLong_FromLongLong(h.prepared_tx)) == NULL)
        goto error;
    if (out != NULL) { /* borrowed: the request holds them */
        out->topic = values[F_TOPIC];
        out->uniq_key = values[F_UNIQ_KEY] ? values[F_UNIQ_KEY] : Py_None;
        out->scheduled = values[F_SCHEDULED] != NULL;
        out->no_wait = no_wait;
        out->durability = durability;
    }
    PyObject *req = build_request(values); /* releases values */
    if (req == NULL) return NULL;
    if (out != NULL) {
        out->header = h;
        out->props_at = pos + p;
    }
    PyObject *fields = want_fields ? header_tuple(r, &h) : Py_NewRef(S.empty_tuple);
    if (fields == NULL) {
        Py_DECREF(req);
        return NULL;
    }
    return pack4(req, fields, pos + body_at, pos + p);
error:
    for (int i = 0; i < F_COUNT; i++) Py_XDECREF(values[i]);
    return NULL;
}

static int need_configured(void) {
    if (!S.configured) {
        PyErr_SetString(PyExc_RuntimeError, "libstore._codec.configure() was not called");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(check_record_doc,
"check_record(buf, pos, limit, check_crc, expected_phy_offset, decode_properties,\n"
"             check_properties, want_fields) -> (DispatchRequest, fields, body_at, props_at)\n"
"    | NotImplemented\n\n"
"record_codec._check_record in C (fields is () unless want_fields). NotImplemented means the\n"
"Python code must answer (a system topic's properties, positions outside the buffer).");

static PyObject *py_check_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "check_record takes 8 arguments");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    long long expected = PyErr_Occurred() ? -1 : PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) { /* not plain ints: the Python code answers (or raises) */
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int check_crc = PyObject_IsTrue(args[3]), decode = PyObject_IsTrue(args[5]);
    int check_props = PyObject_IsTrue(args[6]), want = PyObject_IsTrue(args[7]);
    if (check_crc < 0 || decode < 0 || check_props < 0 || want < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out;
    if (pos < 0 || limit > view.len) {
        out = Py_NewRef(FALLBACK);
    } else {
        out = check_one((const unsigned char *)view.buf, pos, limit, check_crc, expected, decode,
                        check_props, want, NULL, 1);
        if (out == FALLBACK) Py_INCREF(out);
    }
    PyBuffer_Release(&view);
    return out;
}

/* ---------------------------------------------------------------- adopt */

PyDoc_STRVAR(adopt_run_doc,
"adopt_run(buf, pos, index, now_ms, store_host, born_host, sys_flag_mask, max_body, max_records,\n"
"          forbidden, limits, choose_queue, out) -> (pos, index, chosen)\n\n"
"The common case of RecordEncoder.adopt_records in C, from record ``index`` at ``pos`` of the\n"
"bytearray ``buf``: each record that checks out (CRC included), names a topic already in\n"
"``limits`` (dict topic -> queue count), passes the property and size checks and the queue id\n"
"check is made this store's in place and appended to ``out`` (an EncodedBatch); the run stops\n"
"at the first record that needs the Python code (to refuse it or to meet its topic) and\n"
"returns where that record starts, and ``(queue id,)`` when one was already chosen for it.");

static PyObject *py_adopt_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "adopt_run takes 13 arguments");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    PyObject *buf_obj = args[0];
    if (!PyByteArray_Check(buf_obj)) {
        PyErr_SetString(PyExc_TypeError, "adopt_run needs a bytearray");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t index = PyLong_AsSsize_t(args[2]);
    long long now_ms = PyLong_AsLongLong(args[3]);
    long sys_flag_mask = PyLong_AsLong(args[6]);
    long long max_body = PyLong_AsLongLong(args[7]);
    Py_ssize_t max_records = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return NULL;
    const char *store_host, *born_host;
    Py_ssize_t store_host_len, born_host_len;
    if (PyBytes_AsStringAndSize(args[4], (char **)&store_host, &store_host_len) < 0
        || PyBytes_AsStringAndSize(args[5], (char **)&born_host, &born_host_len) < 0)
        return NULL;
    if (store_host_len != 8 || (born_host_len != 0 && born_host_len != 8)) {
        PyErr_SetString(PyExc_ValueError, "store_host must be 8 bytes and born_host 0 or 8");
        return NULL;
    }
    PyObject *forbidden = args[9], *limits = args[10], *choose = args[11], *out = args[12];
    if (!PyAnySet_Check(forbidden) || !PyDict_Check(limits)) {
        PyErr_SetString(PyExc_TypeError, "forbidden must be a set and limits a dict");
        return NULL;
    }
    PyObject *positions = NULL, *sizes = NULL, *ts_positions = NULL, *queue_keys = NULL;
    PyObject *topics = NULL, *uniq_keys = NULL, *requests = NULL, *result = NULL;
    positions = PyObject_GetAttrString(out, "positions");
    sizes = PyObject_GetAttrString(out, "sizes");
    ts_positions = PyObject_GetAttrString(out, "store_ts_positions");
    queue_keys = PyObject_GetAttrString(out, "queue_keys");
    topics = PyObject_GetAttrString(out, "topics");
    uniq_keys = PyObject_GetAttrString(out, "uniq_keys");
    requests = PyObject_GetAttrString(out, "requests");
    PyObject *no_wait = PyObject_GetAttrString(out, "no_wait");
    PyObject *marked = PyObject_GetAttrString(out, "durability_marked");
    int scheduled = 0;
    PyObject *chosen_out = NULL; /* a queue id chosen for the record the run stopped at */
    if (!positions || !sizes || !ts_positions || !queue_keys || !topics || !uniq_keys || !requests || !no_wait
        || !marked)
        goto done;
    if (!PyList_Check(positions) || !PyList_Check(sizes) || !PyList_Check(ts_positions) || !PyList_Check(queue_keys)
        || !PyList_Check(topics) || !PyList_Check(uniq_keys) || !PyList_Check(requests) || !PyList_Check(no_wait)
        || !PyList_Check(marked)) {
        PyErr_SetString(PyExc_TypeError, "the batch's lists are not lists");
        goto done;
    }
    Py_ssize_t limit = PyByteArray_GET_SIZE(buf_obj);
    if (pos < 0 || pos > limit) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto done;
    }
    while (pos < limit) {
        if (max_records && index >= max_records) break;
        /* the buffer may move only if Python code resizes it; nothing called here does */
        unsigned char *buf = (unsigned char *)PyByteArray_AS_STRING(buf_obj);
        Checked c;
        c.props_at = -1;
        PyObject *checked = check_one(buf, pos, limit, 1, 0, 1, 0, 0, &c, 1);
        if (checked == NULL) goto done;
        if (checked == FALLBACK) break;
        Py_ssize_t props_at = c.props_at;
        if (props_at < 0) { /* a blank or bad bytes: the Python code refuses them */
            Py_DECREF(checked);
            break;
        }
        const Header h = c.header;
        PyObject *req = PyTuple_GET_ITEM(checked, 0);
        Py_ssize_t size = h.total, end = pos + size;
        if (props_at < end) {
            int bad = properties_bad(buf + props_at, end - props_at);
            if (bad == 0 && PySet_GET_SIZE(forbidden)) bad = names_forbidden(buf + props_at, end - props_at, forbidden);
            if (bad != 0) {
                Py_DECREF(checked);
                if (bad < 0) goto done;
                break;
            }
        }
        int32_t sys_flag = h.sys_flag;
        int32_t masked = sys_flag & (int32_t)(sys_flag_mask | BORNHOST_V6 | STOREHOST_V6);
        PyObject *topic = Py_NewRef(c.topic);
        PyObject *limit_obj = PyDict_GetItemWithError(limits, topic);
        if ((masked & STOREHOST_V6) || limit_obj == NULL || (h.body_len > max_body)) {
            Py_DECREF(topic);
            Py_DECREF(checked);
            if (PyErr_Occurred()) goto done;
            break;
        }
        long long queue_limit;
        if (!as_int(limit_obj, INT64_MIN, INT64_MAX, &queue_limit)) { /* not a plain int: Python */
            Py_DECREF(topic);
            Py_DECREF(checked);
            break;
        }
        long long queue_id = h.queue_id;
        if (queue_id == -1 && choose != Py_None) {
            if (queue_limit <= 0) { /* the Python code words the refusal */
                Py_DECREF(topic);
                Py_DECREF(checked);
                break;
            }
            long long next = -2; /* the queue a QueueRoundRobin gave in C; -2: call the chooser */
            if (PyDict_Check(choose) && queue_limit <= INT32_MAX) {
                next = round_robin_next(choose, topic, queue_limit);
                if (next == -1) {
                    Py_DECREF(topic);
                    Py_DECREF(checked);
                    goto done;
                }
            }
            if (next >= 0) {
                queue_id = next;
            } else {
                PyObject *chosen = PyObject_CallOneArg(choose, topic);
                if (chosen == NULL) { /* as the Python code would: the chooser's error, unchanged */
                    Py_DECREF(topic);
                    Py_DECREF(checked);
                    goto done;
                }
                if (!as_int(chosen, 0, queue_limit - 1, &queue_id)) {
                    /* out of range or not a plain int: hand it back (chosen once) for the Python
                     * code to place or refuse */
                    chosen_out = chosen;
                    Py_DECREF(topic);
                    Py_DECREF(checked);
                    break;
                }
                Py_DECREF(chosen);
                buf = (unsigned char *)PyByteArray_AS_STRING(buf_obj);
                if (PyByteArray_GET_SIZE(buf_obj) != limit) {
                    Py_DECREF(topic);
                    Py_DECREF(checked);
                    PyErr_SetString(PyExc_RuntimeError, "the buffer changed size during adopt_run");
                    goto done;
                }
            }
        }
        if (!(0 <= queue_id && queue_id < queue_limit)) { /* the Python code refuses it */
            Py_DECREF(topic);
            Py_DECREF(checked);
            break;
        }
        /* from here the record is accepted: make it this store's */
        if (masked != sys_flag) {
            wr32(buf + pos + SYS_FLAG_POSITION, masked);
            if (set_field(req, F_SYS_FLAG, PyLong_FromLong(masked)) < 0) goto fail_record;
        }
        if (queue_id != h.queue_id) {
            wr32(buf + pos + QUEUE_ID_POSITION, (int32_t)queue_id);
            if (set_field(req, F_QUEUE_ID, PyLong_FromLongLong(queue_id)) < 0) goto fail_record;
        }
        Py_ssize_t ts_position = 48 + h.born_len;
        memcpy(buf + pos + ts_position + 8, store_host, 8);
        if (born_host_len && !(masked & BORNHOST_V6)) {
            static const unsigned char zero[8] = {0};
            if (memcmp(buf + pos + BORN_HOST_POSITION, zero, 8) == 0) memcpy(buf + pos + BORN_HOST_POSITION, born_host, 8);
        }
        if (h.born_ts == 0) wr64(buf + pos + BORN_TS_POSITION, now_ms);
        pos = end;
        PyObject *key;
        if (masked & TX_NO_QUEUE_OFFSET) {
            key = Py_NewRef(Py_None);
        } else {
            key = Py_BuildValue("(OL)", topic, queue_id);
            if (key == NULL) goto fail_record;
        }
        PyObject *uniq = c.uniq_key; /* borrowed */
        PyObject *pos_obj = PyLong_FromSsize_t(pos), *size_o = PyLong_FromSsize_t(size);
        PyObject *ts_o = PyLong_FromSsize_t(ts_position);
        int rc = (pos_obj && size_o && ts_o && PyList_Append(positions, pos_obj) == 0
                  && PyList_Append(sizes, size_o) == 0 && PyList_Append(ts_positions, ts_o) == 0
                  && PyList_Append(queue_keys, key) == 0 && PyList_Append(topics, topic) == 0
                  && PyList_Append(uniq_keys, uniq) == 0 && PyList_Append(requests, req) == 0)
                     ? 0
                     : -1;
        if (rc == 0 && c.no_wait) rc = append_index(no_wait, index);
        if (rc == 0 && c.durability) rc = append_index(marked, index);
        if (c.scheduled) scheduled = 1;
        Py_XDECREF(pos_obj);
        Py_XDECREF(size_o);
        Py_XDECREF(ts_o);
        Py_DECREF(key);
        Py_DECREF(topic);
        Py_DECREF(checked);
        if (rc < 0) goto done;
        index++;
        continue;
    fail_record:
        Py_DECREF(topic);
        Py_DECREF(checked);
        goto done;
    }
    if (scheduled && PyObject_SetAttrString(out, "scheduled", Py_True) < 0) goto done;
    result = chosen_out ? Py_BuildValue("(nn(O))", pos, index, chosen_out) : Py_BuildValue("(nnO)", pos, index, Py_None);
done:
    Py_XDECREF(chosen_out);
    Py_XDECREF(positions);
    Py_XDECREF(sizes);
    Py_XDECREF(ts_positions);
    Py_XDECREF(queue_keys);
    Py_XDECREF(topics);
    Py_XDECREF(uniq_keys);
    Py_XDECREF(requests);
    Py_XDECREF(no_wait);
    Py_XDECREF(marked);
    return result;
}

/* --------------------------------------------------------------- decode */

/* libstore.message_id.create_message_id into d: (store host + >q offset).hex().upper(), the
   2 * (host_len + 8) characters (host_len 8 or 20); returns the byte after them. */
static unsigned char *write_hex_id(unsigned char *d, const unsigned char *host, Py_ssize_t host_len,
                                   int64_t phy_offset) {
    static const char digits[] = "0123456789ABCDEF";
    unsigned char raw[28];
    memcpy(raw, host, (size_t)host_len);
    wr64(raw + host_len, phy_offset);
    for (Py_ssize_t i = 0; i < host_len + 8; i++) {
        *d++ = (unsigned char)digits[raw[i] >> 4];
        *d++ = (unsigned char)digits[raw[i] & 15];
    }
    return d;
}

static PyObject *hex_id(const unsigned char *host, Py_ssize_t host_len, int64_t phy_offset) {
    PyObject *out = PyUnicode_New(2 * (host_len + 8), 127);
    if (out == NULL) return NULL;
    write_hex_id(PyUnicode_1BYTE_DATA(out), host, host_len, phy_offset);
    return out;
}

/* Property names decoded last: every record of a pull names the same few properties, so a
 * byte compare here saves decoding, allocating and hashing each name again (one string object,
 * its hash kept, serves every record). Not interned: names come from any producer, and some
 * Python versions (3.12.0-3.12.5) never free interned strings. Only ASCII names of up to
 * PROP_NAME_MAX bytes; slots replaced in turn; only touched with the GIL held. */
#define NAME_SLOTS 16
#define PROP_NAME_MAX 32
static struct {
    unsigned char raw[PROP_NAME_MAX];
    Py_ssize_t len;
    PyObject *name;
} name_cache[NAME_SLOTS];
static int name_next;

static PyObject *property_name(const unsigned char *p, Py_ssize_t n) {
    if (n > PROP_NAME_MAX || !is_ascii(p, n)) return PyUnicode_DecodeUTF8((const char *)p, n, "replace");
    for (int i = 0; i < NAME_SLOTS; i++) {
        if (name_cache[i].len == n && name_cache[i].name != NULL && memcmp(name_cache[i].raw, p, (size_t)n) == 0)
            return Py_NewRef(name_cache[i].name);
    }
    PyObject *name = PyUnicode_FromStringAndSize((const char *)p, n);
    if (name == NULL) return NULL;
    int slot = name_next;
    name_next = (name_next + 1) % NAME_SLOTS;
    Py_XSETREF(name_cache[slot].name, Py_NewRef(name));
    memcpy(name_cache[slot].raw, p, (size_t)n);
    name_cache[slot].len = n;
    return name;
}

/* record_codec.bytes_to_properties from the bytes: that decodes the whole with "replace" and
 * splits on \x02, pieces of >= 3 characters at the first \x01, dropping entries with an empty
 * name or value. UTF-8 decoding resynchronizes at every ASCII byte (\x01 and \x02 are never
 * part of a sequence, and "replace" never swallows one), so splitting the bytes first and
 * decoding each name and value on its own gives the same strings; and a piece whose name and
 * value are both non-empty is at least 3 characters. */
static PyObject *parse_properties(const unsigned char *p, Py_ssize_t n) {
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    const unsigned char *end = p + n;
    while (p < end) {
        const unsigned char *stop = memchr(p, 2, (size_t)(end - p));
        if (stop == NULL) stop = end;
        const unsigned char *sep = memchr(p, 1, (size_t)(stop - p));
        if (sep != NULL && sep > p && sep + 1 < stop) {
            PyObject *key = property_name(p, sep - p);
            PyObject *value = key ? PyUnicode_DecodeUTF8((const char *)sep + 1, stop - sep - 1, "replace") : NULL;
            int rc = value ? PyDict_SetItem(out, key, value) : -1;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (rc < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        if (stop == end) break;
        p = stop + 1;
    }
    return out;
}

/* An int for ``v``, the same object as last time when ``v`` is the value it was then: the
 * records of a pull share their sizes, magic code, flags and, put as a batch, their born and
 * store times, and an int is immutable, so one object serves them all. GIL held. */
typedef struct {
    long long value;
    PyObject *obj;
} IntMemo;

static PyObject *memo_int(IntMemo *m, long long v) {
    if (m->obj != NULL && m->value == v) return Py_NewRef(m->obj);
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return NULL;
    Py_XSETREF(m->obj, Py_NewRef(o));
    m->value = v;
    return o;
}

enum { M_TOTAL, M_MAGIC, M_QUEUE_ID, M_FLAG, M_SYS_FLAG, M_BORN_TS, M_STORE_TS, M_RECONSUME, M_PREPARED, M_COUNT };
static IntMemo int_memo[M_COUNT];

/* The hosts decoded last: a pull's records nearly all share their born host and store host,
 * and the (ip, port) tuple of an encoded host never changes, so a byte compare here saves the
 * bytes object and the call into Python for each. Two slots, replaced in turn; only touched
 * with the GIL held. */
#define HOST_SLOTS 2
static struct {
    unsigned char raw[20];
    Py_ssize_t len;
    PyObject *value;
} host_cache[HOST_SLOTS];
static int host_next;

static PyObject *decoded_host(const unsigned char *raw, Py_ssize_t len) {
    for (int i = 0; i < HOST_SLOTS; i++) {
        if (host_cache[i].value != NULL && host_cache[i].len == len && memcmp(host_cache[i].raw, raw, (size_t)len) == 0)
            return Py_NewRef(host_cache[i].value);
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)raw, len);
    if (b == NULL) return NULL;
    PyObject *out = PyObject_CallOneArg(S.decode_host, b);
    Py_DECREF(b);
    if (out != NULL && len <= 20) {
        int slot = host_next;
        host_next = (host_next + 1) % HOST_SLOTS;
        Py_XSETREF(host_cache[slot].value, Py_NewRef(out));
        memcpy(host_cache[slot].raw, raw, (size_t)len);
        host_cache[slot].len = len;
    }
    return out;
}

/* The MessageRecord of the record at buf[pos:limit] (a new reference), NotImplemented (a new
 * reference) for anything that is not a valid record (the Python code words the error), NULL
 * with an exception set. */
static PyObject *decode_at(const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t limit,
                           int check_crc) {
    if (pos < 0 || limit > len) return Py_NewRef(Py_NotImplemented);
    Checked c;
    c.props_at = -1;
    PyObject *checked = check_one(buf, pos, limit, check_crc, -1, 0, 0, 0, &c, 0);
    if (checked == NULL) return NULL;
    if (checked != Py_None) { /* refused (a tuple) or FALLBACK: the Python code words it */
        if (checked != FALLBACK) Py_DECREF(checked);
        return Py_NewRef(Py_NotImplemented);
    }
    Py_DECREF(checked);
    const Header *h = &c.header;
    const unsigned char *r = buf + pos;
    PyObject *v[18] = {NULL};
    v[15] = c.topic; /* owned */
    Py_ssize_t end = pos + h->total;
    IntMemo *m = int_memo;
    if ((v[0] = memo_int(&m[M_TOTAL], h->total)) == NULL || (v[1] = memo_int(&m[M_MAGIC], h->magic)) == NULL
        || (v[2] = PyLong_FromLong(h->body_crc)) == NULL || (v[3] = memo_int(&m[M_QUEUE_ID], h->queue_id)) == NULL
        || (v[4] = memo_int(&m[M_FLAG], h->flag)) == NULL || (v[5] = PyLong_FromLongLong(h->queue_offset)) == NULL
        || (v[6] = PyLong_FromLongLong(h->phy_offset)) == NULL || (v[7] = memo_int(&m[M_SYS_FLAG], h->sys_flag)) == NULL
        || (v[8] = memo_int(&m[M_BORN_TS], h->born_ts)) == NULL
        || (v[9] = decoded_host(r + h->born_at, h->born_len)) == NULL
        || (v[10] = memo_int(&m[M_STORE_TS], h->store_ts)) == NULL
        || (v[11] = decoded_host(r + h->store_at, h->store_len)) == NULL
        || (v[12] = memo_int(&m[M_RECONSUME], h->reconsume)) == NULL
        || (v[13] = memo_int(&m[M_PREPARED], h->prepared_tx)) == NULL
        || (v[14] = PyBytes_FromStringAndSize((const char *)buf + c.body_at, h->body_len)) == NULL
        || (v[16] = parse_properties(buf + c.props_at, end - c.props_at)) == NULL
        || (v[17] = hex_id(r + h->store_at, h->store_len, h->phy_offset)) == NULL) {
        for (int i = 0; i < 18; i++) Py_XDECREF(v[i]);
        return NULL;
    }
    /* An instance of exactly the configured type, fresh from tp_alloc (its slots NULL): each
     * value goes where configure_record found its __slots__ slot, the reference handed over.
     * The type and its offsets are taken together, before tp_alloc (which may collect garbage
     * and so run Python code, a configure_record included). */
    PyTypeObject *type = (PyTypeObject *)Py_NewRef(S.record_type);
    Py_ssize_t at[18];
    memcpy(at, S.record_slot_at, sizeof at);
    PyObject *rec = type->tp_alloc(type, 0);
    Py_DECREF(type); /* the instance holds its type now */
    if (rec == NULL) {
        for (int i = 0; i < 18; i++) Py_DECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < 18; i++) *(PyObject **)((char *)rec + at[i]) = v[i];
    /* Not tracked by the cyclic garbage collector: its fields are numbers, bytes, strings, a
     * (str, int) host tuple and a dict of strings, none of which can lead back to it. A pull
     * decodes hundreds of records at once and the caller keeps them a while; tracked, each
     * young collection walked them and promoted them to the older generations, whose
     * collections walked them again (~30% of the time spent decoding). A record made part of
     * a cycle later (a field set to something that refers back to it) is then freed only if
     * the cycle is broken by hand. */
    PyObject_GC_UnTrack(rec);
    return rec;
}

PyDoc_STRVAR(decode_record_doc,
"decode_record(buf, pos, limit, check_crc) -> MessageRecord | NotImplemented\n\n"
"record_codec.decode_record in C for a valid record; NotImplemented for anything else (the\n"
"Python code then raises CorruptRecordError with its wording).");

static PyObject *py_decode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_record takes 4 arguments");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    if (S.record_type == NULL) Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int check_crc = PyObject_IsTrue(args[3]);
    if (check_crc < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = decode_at((const unsigned char *)view.buf, view.len, pos, limit, check_crc);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(raws, check_crc) -> list[MessageRecord] | NotImplemented\n\n"
"record_codec.decode_records in C: each of the list ``raws`` (bytes, one whole record each)\n"
"decoded as decode_record decodes it; NotImplemented as soon as one is not a valid record (the\n"
"Python code then finds it and raises CorruptRecordError with its wording).");

static PyObject *py_decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode_records(raws: list, check_crc)");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    if (S.record_type == NULL) Py_RETURN_NOTIMPLEMENTED;
    int check_crc = PyObject_IsTrue(args[1]);
    if (check_crc < 0) return NULL;
    PyObject *raws = args[0];
    Py_ssize_t n = PyList_GET_SIZE(raws);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (!PyBytes_Check(raw)) {
            Py_DECREF(out);
            Py_RETURN_NOTIMPLEMENTED;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(raw);
        Py_INCREF(raw); /* decode_at may run Python code (decode_host, a collection) that empties the list */
        PyObject *rec = decode_at((const unsigned char *)PyBytes_AS_STRING(raw), len, 0, len, check_crc);
        Py_DECREF(raw);
        if (rec == NULL || rec == Py_NotImplemented) {
            Py_DECREF(out);
            return rec;
        }
        PyList_SET_ITEM(out, i, rec);
    }
    return out;
}

/* ------------------------------------------------------ PullMany replies */

/* A protobuf varint at b[*pos..len): 0 with the value and *pos moved past it; -1 when the
 * bytes end first or it runs past 10 bytes. */
static int wire_varint(const unsigned char *b, Py_ssize_t len, Py_ssize_t *pos, uint64_t *out) {
    Py_ssize_t p = *pos;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= len) return -1;
        unsigned char c = b[p++];
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *pos = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Past a field's value of wire type ``wt`` at b[*pos..len): 0, or -1 (groups, wire types 6
 * and 7, values cut short). */
static int wire_skip(const unsigned char *b, Py_ssize_t len, Py_ssize_t *pos, int wt) {
    uint64_t v;
    switch (wt) {
    case 0: return wire_varint(b, len, pos, &v);
    case 1: if (len - *pos < 8) return -1; *pos += 8; return 0;
    case 5: if (len - *pos < 4) return -1; *pos += 4; return 0;
    case 2:
        if (wire_varint(b, len, pos, &v) < 0 || v > (uint64_t)(len - *pos)) return -1;
        *pos += (Py_ssize_t)v;
        return 0;
    default: return -1;
    }
}

/* One PullResponse at b[start..end) (a PullMany result, raw form). With ``records`` NULL:
 * its (queue_id, next_offset, skipped, record count, start, end) as a new reference; else
 * each record decoded where it lies (as decode_records decodes it) and appended to
 * ``records``, and None. NotImplemented (a new reference) for anything the protobuf runtime
 * should decide (a field with an unexpected wire type, the messages field of the non-raw form,
 * a record decode_at leaves to Python, bytes cut short); NULL with an exception set. Scalars:
 * the last occurrence wins, as protobuf merges them. */
static PyObject *pulled_queue(const unsigned char *b, Py_ssize_t start, Py_ssize_t end, int check_crc,
                              PyObject *records) {
    uint64_t queue_id = 0, next_offset = 0, skipped = 0;
    Py_ssize_t count = 0, p = start;
    while (p < end) {
        uint64_t key, v;
        if (wire_varint(b, end, &p, &key) < 0) Py_RETURN_NOTIMPLEMENTED;
        uint64_t field = key >> 3;
        int wt = (int)(key & 7);
        if (field == 6) { /* records */
            if (wt != 2 || wire_varint(b, end, &p, &v) < 0 || v > (uint64_t)(end - p)) Py_RETURN_NOTIMPLEMENTED;
            if (records != NULL) {
                PyObject *rec = decode_at(b, end, p, p + (Py_ssize_t)v, check_crc);
                if (rec == NULL || rec == Py_NotImplemented) return rec;
                int rc = PyList_Append(records, rec);
                Py_DECREF(rec);
                if (rc < 0) return NULL;
            }
            count++;
            p += (Py_ssize_t)v;
        } else if (field == 2 || field == 8 || field == 9) { /* next_offset, skipped, queue_id */
            if (wt != 0 || wire_varint(b, end, &p, &v) < 0) Py_RETURN_NOTIMPLEMENTED;
            if (field == 2) next_offset = v;
            else if (field == 8) skipped = v;
            else queue_id = v;
        } else if (field == 5 || field == 0) { /* messages (the non-raw form), or no field */
            Py_RETURN_NOTIMPLEMENTED;
        } else if (field == 7 && wt == 2) { /* queue_offsets, packed: protobuf reads every varint */
            if (wire_varint(b, end, &p, &v) < 0 || v > (uint64_t)(end - p)) Py_RETURN_NOTIMPLEMENTED;
            Py_ssize_t stop = p + (Py_ssize_t)v;
            while (p < stop) {
                uint64_t offset;
                if (wire_varint(b, stop, &p, &offset) < 0) Py_RETURN_NOTIMPLEMENTED; /* cut short */
            }
        } else if (wire_skip(b, end, &p, wt) < 0) { /* status, min/max offset, queue_offsets, unknown */
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    if (records != NULL) Py_RETURN_NONE;
    /* int32 and int64 fields, two's complement as protobuf sends negative values */
    return Py_BuildValue("(iLLnnn)", (int)(int32_t)(uint32_t)queue_id, (long long)next_offset,
                         (long long)skipped, count, start, end);
}

PyDoc_STRVAR(pull_many_results_doc,
"pull_many_results(reply) -> list[(queue_id, next_offset, skipped, count, start, end)]\n"
"                             | NotImplemented\n\n"
"A serialized mqstore.v1.PullManyResponse (bytes) read as its raw-form results without building\n"
"the protobuf message: per result its queue id, next offset, skipped count, how many records it\n"
"carries and where it lies in ``reply`` (for pull_result_records). NotImplemented for whatever\n"
"the protobuf runtime should read instead (services.client falls back to it).");

static PyObject *py_pull_many_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pull_many_results(reply: bytes)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]), p = 0;
    PyObject *out = PyList_New(0);
    while (out != NULL && p < len) {
        uint64_t key, v;
        PyObject *item;
        if (wire_varint(b, len, &p, &key) < 0 || (key >> 3) == 0) {
            item = Py_NewRef(Py_NotImplemented);
        } else if ((key >> 3) == 1) { /* results */
            if ((key & 7) != 2 || wire_varint(b, len, &p, &v) < 0 || v > (uint64_t)(len - p)) {
                item = Py_NewRef(Py_NotImplemented);
            } else {
                item = pulled_queue(b, p, p + (Py_ssize_t)v, 0, NULL);
                p += (Py_ssize_t)v;
            }
        } else if (wire_skip(b, len, &p, (int)(key & 7)) < 0) {
            item = Py_NewRef(Py_NotImplemented);
        } else {
            continue;
        }
        if (item == NULL || item == Py_NotImplemented || PyList_Append(out, item) < 0) {
            Py_CLEAR(out);
            if (item == Py_NotImplemented) out = item; /* the reference handed back */
            else Py_XDECREF(item);
            break;
        }
        Py_DECREF(item);
    }
    return out;
}

PyDoc_STRVAR(pull_result_records_doc,
"pull_result_records(reply, start, end, check_crc) -> list[MessageRecord] | NotImplemented\n\n"
"The records of the PullManyResponse result at reply[start:end] (as pull_many_results found\n"
"it), each decoded where it lies, as decode_records decodes it; NotImplemented as soon as one\n"
"is left to Python (the caller then decodes them through the protobuf runtime, which words the\n"
"error).");

static PyObject *py_pull_result_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pull_result_records(reply: bytes, start, end, check_crc)");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    if (S.record_type == NULL) Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = start == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    int check_crc = PyObject_IsTrue(args[3]);
    if (check_crc < 0) return NULL;
    PyObject *reply = Py_NewRef(args[0]); /* held: decode_at may run Python code */
    if (start < 0 || end < start || end > PyBytes_GET_SIZE(reply)) {
        Py_DECREF(reply);
        PyErr_SetString(PyExc_ValueError, "pull_result_records: start and end must lie within the reply");
        return NULL;
    }
    PyObject *records = PyList_New(0);
    PyObject *rc = records ? pulled_queue((const unsigned char *)PyBytes_AS_STRING(reply), start, end, check_crc,
                                          records)
                           : NULL;
    Py_DECREF(reply);
    if (rc == Py_None) {
        Py_DECREF(rc);
        return records;
    }
    Py_XDECREF(records);
    return rc; /* NULL or NotImplemented */
}

/* -------------------------------------------------------- queue offsets */

PyDoc_STRVAR(assign_offsets_doc,
"assign_offsets(buf, positions, ts_positions, keys, table, start, stop, delta, store_ts, qoffs)\n"
"    -> None\n\n"
"record_codec.assign_offsets in C: the put lock's loop over records start..stop-1 of an\n"
"encoded batch (``buf`` a bytearray, ``table`` a dict).");

static PyObject *py_assign_offsets(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "assign_offsets takes 10 arguments");
        return NULL;
    }
    PyObject *buf_obj = args[0], *positions = args[1], *ts_positions = args[2], *keys = args[3];
    PyObject *table = args[4], *qoffs = args[9];
    if (!PyByteArray_Check(buf_obj) || !PyList_Check(positions) || !PyList_Check(ts_positions)
        || !PyList_Check(keys) || !PyDict_Check(table) || !PyList_Check(qoffs)) {
        PyErr_SetString(PyExc_TypeError, "assign_offsets: bytearray, lists and a dict expected");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[5]), stop = PyLong_AsSsize_t(args[6]);
    long long delta = PyLong_AsLongLong(args[7]), store_ts = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || stop < start || stop > PyList_GET_SIZE(positions) || stop > PyList_GET_SIZE(ts_positions)
        || stop > PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_IndexError, "assign_offsets: start/stop outside the batch");
        return NULL;
    }
    PyObject *zero = NULL;
    for (Py_ssize_t k = start; k < stop; k++) {
        if (k >= PyList_GET_SIZE(positions) || k >= PyList_GET_SIZE(ts_positions) || k >= PyList_GET_SIZE(keys)) {
            PyErr_SetString(PyExc_IndexError, "assign_offsets: the batch changed size");
            goto error;
        }
        Py_ssize_t pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, k));
        Py_ssize_t ts_at = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(PyList_GET_ITEM(ts_positions, k));
        if (PyErr_Occurred()) goto error;
        Py_ssize_t len = PyByteArray_GET_SIZE(buf_obj);
        if (pos < 0 || pos + 36 > len || ts_at < 0 || pos + ts_at + 8 > len) {
            PyErr_SetString(PyExc_ValueError, "assign_offsets: a record lies outside the buffer");
            goto error;
        }
        if ((delta > 0 && pos > INT64_MAX - delta) || (delta < 0 && pos < INT64_MIN - delta)) {
            PyErr_SetString(PyExc_OverflowError, "assign_offsets: physical offset out of range");
            goto error;
        }
        PyObject *key = Py_NewRef(PyList_GET_ITEM(keys, k));
        long long queue_offset = 0;
        PyObject *qo_obj;
        if (key == Py_None) {
            Py_DECREF(key);
            if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) goto error;
            qo_obj = Py_NewRef(zero);
        } else {
            PyObject *next = PyDict_GetItemWithError(table, key);
            if (next == NULL && PyErr_Occurred()) {
                Py_DECREF(key);
                goto error;
            }
            if (next != NULL) {
                qo_obj = Py_NewRef(next);
                queue_offset = PyLong_AsLongLong(qo_obj);
                if ((queue_offset == -1 && PyErr_Occurred()) || queue_offset == INT64_MAX) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "queue offset out of range");
                    Py_DECREF(qo_obj);
                    Py_DECREF(key);
                    goto error;
                }
            } else {
                if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) {
                    Py_DECREF(key);
                    goto error;
                }
                qo_obj = Py_NewRef(zero);
            }
            PyObject *after = PyLong_FromLongLong(queue_offset + 1);
            int rc = after == NULL ? -1 : PyDict_SetItem(table, key, after);
            Py_XDECREF(after);
            Py_DECREF(key);
            if (rc < 0) {
                Py_DECREF(qo_obj);
                goto error;
            }
        }
        /* the dict calls above may run Python code (a key's __eq__): reread the buffer */
        unsigned char *buf = (unsigned char *)PyByteArray_AS_STRING(buf_obj);
        if (PyByteArray_GET_SIZE(buf_obj) != len) {
            Py_DECREF(qo_obj);
            PyErr_SetString(PyExc_RuntimeError, "the buffer changed size during assign_offsets");
            goto error;
        }
        wr64(buf + pos + 20, queue_offset);
        wr64(buf + pos + 28, pos + delta);
        wr64(buf + pos + ts_at, store_ts);
        int rc = PyList_Append(qoffs, qo_obj);
        Py_DECREF(qo_obj);
        if (rc < 0) goto error;
    }
    Py_XDECREF(zero);
    Py_RETURN_NONE;
error:
    Py_XDECREF(zero);
    return NULL;
}

/* --------------------------------------------------------------- encode */


/* Serialized properties of one message as properties_to_bytes writes them, into a new bytes
 * object; ``*waits`` becomes 0 when WAIT is there, not empty and not "true" in any letter case
 * (is_true_text). Returns NULL with no exception set when the Python code must encode them
 * (and word any refusal), or with one set on a real error. */
static PyObject *encode_properties(PyObject *props, int *waits, int *durability) {
    PyObject *items = NULL;
    Py_ssize_t n;
    if (PyDict_CheckExact(props)) {
        n = PyDict_GET_SIZE(props);
    } else {
        items = PyMapping_Items(props);
        if (items == NULL) {
            PyErr_Clear();
            return NULL;
        }
        n = PyList_GET_SIZE(items);
    }
    *waits = 1;
    *durability = 0;
    PyObject *out = NULL;
    Py_ssize_t cap = 64, used = 0;
    char *raw = PyMem_Malloc((size_t)cap);
    if (raw == NULL) {
        Py_XDECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t it = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k, *v;
        if (items == NULL) {
            if (!PyDict_Next(props, &it, &k, &v)) break;
        } else {
            PyObject *pair = PyList_GET_ITEM(items, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) goto slow;
            k = PyTuple_GET_ITEM(pair, 0);
            v = PyTuple_GET_ITEM(pair, 1);
        }
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) goto slow;
        Py_ssize_t kl, vl;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
        const char *vs = ks ? PyUnicode_AsUTF8AndSize(v, &vl) : NULL;
        if (vs == NULL) { /* not encodable (a lone surrogate): the Python code refuses it */
            PyErr_Clear();
            goto slow;
        }
        if (kl == 0 || memchr(ks, 1, (size_t)kl) || memchr(ks, 2, (size_t)kl) || memchr(vs, 1, (size_t)vl)
            || memchr(vs, 2, (size_t)vl))
            goto slow;
        if (kl == 4 && memcmp(ks, "WAIT", 4) == 0) *waits = vl == 0 || is_true_text(vs, vl);
        if (kl == 10 && memcmp(ks, "DURABILITY", 10) == 0) *durability = 1;
        Py_ssize_t need = used + kl + vl + 2;
        if (need > 32767) goto slow; /* PropertiesSizeExceededError, worded by the Python code */
        if (need > cap) {
            while (cap < need) cap *= 2;
            char *grown = PyMem_Realloc(raw, (size_t)cap);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto slow; /* with MemoryError set: the caller tells the two apart */
            }
            raw = grown;
        }
        memcpy(raw + used, ks, (size_t)kl);
        raw[used + kl] = 1;
        memcpy(raw + used + kl + 1, vs, (size_t)vl);
        raw[used + kl + 1 + vl] = 2;
        used = need;
    }
    out = PyBytes_FromStringAndSize(raw, used);
    PyMem_Free(raw);
    Py_XDECREF(items);
    return out;
slow:
    PyMem_Free(raw);
    Py_XDECREF(items);
    return NULL;
}

typedef struct {
    PyObject *topic, *body, *queue_id, *properties, *born_host, *sys_flag, *flag, *born_timestamp,
        *reconsume_times, *prepared_transaction_offset;
} MessageAttrs;

static void attrs_clear(MessageAttrs *a) {
    Py_CLEAR(a->topic); Py_CLEAR(a->body); Py_CLEAR(a->queue_id); Py_CLEAR(a->properties);
    Py_CLEAR(a->born_host); Py_CLEAR(a->sys_flag); Py_CLEAR(a->flag); Py_CLEAR(a->born_timestamp);
    Py_CLEAR(a->reconsume_times); Py_CLEAR(a->prepared_transaction_offset);
}

static int attrs_get(PyObject *m, MessageAttrs *a) {
    memset(a, 0, sizeof(*a));
    a->topic = PyObject_GetAttr(m, S.n_topic);
    a->body = a->topic ? PyObject_GetAttr(m, S.n_body) : NULL;
    a->queue_id = a->body ? PyObject_GetAttr(m, S.n_queue_id) : NULL;
    a->properties = a->queue_id ? PyObject_GetAttr(m, S.n_properties) : NULL;
    a->born_host = a->properties ? PyObject_GetAttr(m, S.n_born_host) : NULL;
    a->sys_flag = a->born_host ? PyObject_GetAttr(m, S.n_sys_flag) : NULL;
    a->flag = a->sys_flag ? PyObject_GetAttr(m, S.n_flag) : NULL;
    a->born_timestamp = a->flag ? PyObject_GetAttr(m, S.n_born_timestamp) : NULL;
    a->reconsume_times = a->born_timestamp ? PyObject_GetAttr(m, S.n_reconsume_times) : NULL;
    a->prepared_transaction_offset =
        a->reconsume_times ? PyObject_GetAttr(m, S.n_prepared_transaction_offset) : NULL;
    if (a->prepared_transaction_offset == NULL) {
        PyErr_Clear();
        attrs_clear(a);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(encode_run_doc,
"encode_run(messages, index, buf, sizes, queue_keys, wide_born, no_wait, topics, hosts,\n"
"           store_host, store_v6, max_body, now_ms, choose_queue, unassigned_queue_ok, marked)\n"
"    -> (index, (chosen queue id,) | None, error | None)\n\n"
"The common case of RecordEncoder.encode_batch in C, from ``messages[index]`` (a list): each\n"
"message whose topic is in ``topics`` (dict topic -> (TOPICLEN+TOPIC, magic, queue count)),\n"
"whose born host is in ``hosts`` (the encoder's cache) and whose fields pass the checks is\n"
"appended to the bytearray ``buf`` and the lists (``no_wait``: the indexes of messages whose\n"
"WAIT property says not to wait for the store; ``marked``: those with a DURABILITY property).\n"
"Stops at the first message that needs the\n"
"Python code (to refuse it, or to meet its topic or host) and returns its index, the queue id\n"
"already chosen for the message stopped at and the error choosing it raised, for the Python\n"
"code to raise naming the message.");

static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16 || !PyList_Check(args[15])) {
        PyErr_SetString(PyExc_TypeError, "encode_run takes 15 arguments and a list");
        return NULL;
    }
    PyObject *marked = args[15];
    PyObject *messages = args[0], *buf = args[2], *sizes = args[3], *queue_keys = args[4];
    PyObject *wide_born = args[5], *no_wait = args[6], *topics = args[7], *hosts = args[8], *choose = args[13];
    if (!PyList_Check(messages) || !PyByteArray_Check(buf) || !PyList_Check(sizes) || !PyList_Check(queue_keys)
        || !PyList_Check(wide_born) || !PyList_Check(no_wait) || !PyDict_Check(topics) || !PyDict_Check(hosts)
        || !PyBytes_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "encode_run: wrong argument types");
        return NULL;
    }
    Py_ssize_t index = PyLong_AsSsize_t(args[1]);
    long store_v6 = PyErr_Occurred() ? 0 : PyLong_AsLong(args[10]);
    long long max_body = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[11]);
    long long now_ms = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[12]);
    if (PyErr_Occurred()) return NULL;
    int unassigned_ok = PyObject_IsTrue(args[14]);
    if (unassigned_ok < 0) return NULL;
    if (index < 0) {
        PyErr_SetString(PyExc_IndexError, "encode_run: negative index");
        return NULL;
    }
    const char *store_host = PyBytes_AS_STRING(args[9]);
    Py_ssize_t store_len = PyBytes_GET_SIZE(args[9]);
    if (store_len != 8 && store_len != 20) {
        PyErr_SetString(PyExc_ValueError, "store_host must be 8 or 20 bytes");
        return NULL;
    }
    /* For the message the run stops at: the queue id already chosen for it (handed back so it
     * is not chosen twice) or the error choosing raised (re-raised by the Python code, which
     * names the message). */
    PyObject *chosen_obj = NULL, *error_obj = NULL;
    for (; index < PyList_GET_SIZE(messages); index++) {
        PyObject *m = Py_NewRef(PyList_GET_ITEM(messages, index));
        MessageAttrs a;
        if (!attrs_get(m, &a)) {
            Py_DECREF(m);
            break;
        }
        int stop = 1;
        PyObject *props_raw = NULL, *key = NULL, *info = NULL, *born = NULL; /* owned */
        do {
            if (!PyUnicode_CheckExact(a.topic) || !PyBytes_CheckExact(a.body)) break;
            info = PyDict_GetItemWithError(topics, a.topic);
            if (info == NULL) {
                PyErr_Clear();
                break;
            }
            Py_INCREF(info); /* held: dict lookups and callbacks below may run Python code */
            if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(info, 0))) break;
            PyObject *prefix = PyTuple_GET_ITEM(info, 0);
            long long magic, limit, queue_id, sys_flag, flag, born_ts, reconsume, prepared;
            if (!as_int(PyTuple_GET_ITEM(info, 1), INT32_MIN, INT32_MAX, &magic)
                || !as_int(PyTuple_GET_ITEM(info, 2), 0, INT64_MAX, &limit)
                || !as_int(a.queue_id, INT32_MIN, INT32_MAX, &queue_id)
                || !as_int(a.sys_flag, INT32_MIN, INT32_MAX, &sys_flag)
                || !as_int(a.flag, INT32_MIN, INT32_MAX, &flag)
                || !as_int(a.born_timestamp, INT64_MIN, INT64_MAX, &born_ts)
                || !as_int(a.reconsume_times, INT32_MIN, INT32_MAX, &reconsume)
                || !as_int(a.prepared_transaction_offset, INT64_MIN, INT64_MAX, &prepared))
                break;
            Py_ssize_t body_len = PyBytes_GET_SIZE(a.body);
            long long next = -2; /* as in adopt_run: a QueueRoundRobin's queue, chosen in C */
            if (queue_id == -1 && PyDict_Check(choose) && 0 < limit && limit < INT32_MAX) {
                next = round_robin_next(choose, a.topic, limit);
                if (next == -1) {
                    stop = -1;
                    break;
                }
                if (next >= 0) {
                    queue_id = next;
                    chosen_obj = PyLong_FromLongLong(next); /* handed back as a call's would be */
                    if (chosen_obj == NULL) {
                        stop = -1;
                        break;
                    }
                }
            }
            if (queue_id == -1 && choose != Py_None) {
                PyObject *q = PyObject_CallOneArg(choose, a.topic);
                if (q == NULL) {
                    PyObject *type, *value, *tb;
                    PyErr_Fetch(&type, &value, &tb);
                    PyErr_NormalizeException(&type, &value, &tb);
                    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
                    Py_XDECREF(type);
                    Py_XDECREF(tb);
                    error_obj = value;
                    if (error_obj == NULL) stop = -1;
                    break;
                }
                chosen_obj = q; /* handed back if the run stops at this message */
                if (!as_int(q, INT32_MIN, INT32_MAX, &queue_id)) break; /* odd: Python decides */
            }
            if ((body_len > max_body || !(0 <= queue_id && queue_id < limit))
                && !(unassigned_ok && queue_id == -1 && body_len <= max_body))
                break;
            int truthy = PyObject_IsTrue(a.properties);
            if (truthy < 0) {
                PyErr_Clear();
                break;
            }
            int waits = 1, durability = 0;
            if (truthy) {
                props_raw = encode_properties(a.properties, &waits, &durability);
                if (props_raw == NULL) {
                    if (PyErr_Occurred()) {
                        if (PyErr_ExceptionMatches(PyExc_MemoryError)) stop = -1;
                        else PyErr_Clear();
                    }
                    break;
                }
            }
            born = PyDict_GetItemWithError(hosts, a.born_host);
            if (born == NULL) {
                PyErr_Clear();
                break;
            }
            Py_INCREF(born); /* held: another thread may clear the cache while the CRC runs */
            if (!PyTuple_Check(born) || PyTuple_GET_SIZE(born) < 2 || !PyBytes_Check(PyTuple_GET_ITEM(born, 0))) break;
            PyObject *born_host = PyTuple_GET_ITEM(born, 0);
            long long born_v6;
            if (!as_int(PyTuple_GET_ITEM(born, 1), 0, INT32_MAX, &born_v6)) break;
            Py_ssize_t born_len = PyBytes_GET_SIZE(born_host);
            if (born_len != 8 && born_len != 20) break;
            int32_t flags = (int32_t)((sys_flag & ~(long long)(BORNHOST_V6 | STOREHOST_V6)) | born_v6 | store_v6);
            Py_ssize_t header = 72 + born_len + store_len;
            Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix);
            Py_ssize_t prop_len = props_raw ? PyBytes_GET_SIZE(props_raw) : 0;
            Py_ssize_t total = header + body_len + prefix_len + 2 + prop_len;
            if (total > INT32_MAX) break;
            if (flags & TX_NO_QUEUE_OFFSET) {
                key = Py_NewRef(Py_None);
            } else {
                key = Py_BuildValue("(OL)", a.topic, queue_id);
                if (key == NULL) {
                    stop = -1;
                    break;
                }
            }
            uint32_t crc;
            if (body_crc((const unsigned char *)PyBytes_AS_STRING(a.body), body_len, &crc) < 0) {
                stop = -1;
                break;
            }
            Py_ssize_t at = PyByteArray_GET_SIZE(buf);
            if (PyByteArray_Resize(buf, at + total) < 0) {
                stop = -1;
                break;
            }
            unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(buf) + at;
            wr32(w, (int32_t)total);
            wr32(w + 4, (int32_t)magic);
            wr32(w + 8, (int32_t)(crc & 0x7FFFFFFFu));
            wr32(w + 12, (int32_t)queue_id);
            wr32(w + 16, (int32_t)flag);
            wr64(w + 20, 0);
            wr64(w + 28, 0);
            wr32(w + 36, flags);
            wr64(w + 40, born_ts ? born_ts : now_ms);
            memcpy(w + 48, PyBytes_AS_STRING(born_host), (size_t)born_len);
            Py_ssize_t p = 48 + born_len;
            wr64(w + p, 0);
            memcpy(w + p + 8, store_host, (size_t)store_len);
            p += 8 + store_len;
            wr32(w + p, (int32_t)reconsume);
            wr64(w + p + 4, prepared);
            wr32(w + p + 12, (int32_t)body_len);
            p += 16;
            memcpy(w + p, PyBytes_AS_STRING(a.body), (size_t)body_len);
            p += body_len;
            memcpy(w + p, PyBytes_AS_STRING(prefix), (size_t)prefix_len);
            p += prefix_len;
            w[p] = (unsigned char)(prop_len >> 8);
            w[p + 1] = (unsigned char)prop_len;
            if (prop_len) memcpy(w + p + 2, PyBytes_AS_STRING(props_raw), (size_t)prop_len);
            PyObject *size_obj = PyLong_FromSsize_t(total);
            if (size_obj == NULL || PyList_Append(sizes, size_obj) < 0 || PyList_Append(queue_keys, key) < 0) {
                Py_XDECREF(size_obj);
                stop = -1;
                break;
            }
            Py_DECREF(size_obj);
            if ((born_v6 && append_index(wide_born, index) < 0) || (!waits && append_index(no_wait, index) < 0)
                || (durability && append_index(marked, index) < 0)) {
                stop = -1;
                break;
            }
            stop = 0;
            Py_CLEAR(chosen_obj);
        } while (0);
        Py_XDECREF(props_raw);
        Py_XDECREF(key);
        Py_XDECREF(info);
        Py_XDECREF(born);
        attrs_clear(&a);
        Py_DECREF(m);
        if (stop < 0) {
            Py_XDECREF(chosen_obj);
            Py_XDECREF(error_obj);
            return NULL;
        }
        if (stop) break;
    }
    PyObject *chosen = chosen_obj ? PyTuple_Pack(1, chosen_obj) : Py_NewRef(Py_None);
    Py_XDECREF(chosen_obj);
    if (chosen == NULL) {
        Py_XDECREF(error_obj);
        return NULL;
    }
    return Py_BuildValue("(nNN)", index, chosen, error_obj ? error_obj : Py_NewRef(Py_None));
}

/* ------------------------------------------------------------- configure */

PyDoc_STRVAR(configure_doc,
"configure(request_type, system_codes, crc32) -> None\n\n"
"Tell the module the DispatchRequest class it builds (its slots, in __init__ order), where\n"
"each system topic's units keep their tags code (system_topics.SYSTEM_CODE_PROPERTIES: topic ->\n"
"property name, None for the store time, b'' for none) and the CRC-32 function to call for\n"
"bodies (None: zlib's).");

/* Where each member descriptor of ``descr`` keeps its value in an instance of ``type``: a
 * __slots__ slot (T_OBJECT_EX) of the class or a base, inside its instances, no two the same.
 * Fills ``out`` and returns -1 when all are; else the index of the first that is not (``out``
 * then partly set). */
static int slot_offsets(PyTypeObject *type, PyObject *const *descr, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyMemberDef *member = Py_IS_TYPE(descr[i], &PyMemberDescr_Type)
                                  ? ((PyMemberDescrObject *)descr[i])->d_member
                                  : NULL;
        if (member == NULL || member->type != T_OBJECT_EX || !PyType_IsSubtype(type, PyDescr_TYPE(descr[i]))
            || member->offset < (Py_ssize_t)sizeof(PyObject)
            || member->offset > type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *))
            return i;
        for (int k = 0; k < i; k++) {
            if (out[k] == member->offset) return i; /* two fields in one slot */
        }
        out[i] = member->offset;
    }
    return -1;
}

static PyObject *py_configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyDict_Check(args[1])
        || (args[2] != Py_None && !PyCallable_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "configure(request_type: type, system_codes: dict, crc32)");
        return NULL;
    }
    PyObject *descr[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        descr[i] = PyObject_GetAttrString(args[0], FIELD_NAMES[i]);
        if (descr[i] == NULL || Py_TYPE(descr[i])->tp_descr_set == NULL) {
            for (int k = 0; k <= i; k++) Py_XDECREF(descr[k]);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "slot %s is not settable", FIELD_NAMES[i]);
            return NULL;
        }
    }
    /* queue_runs and index_entries read the slots where __slots__ keep them: each must be a
     * slot of this class (or a base), inside its instances. Nothing is kept unless all are. */
    Py_ssize_t slot_at[F_COUNT];
    int bad = slot_offsets((PyTypeObject *)args[0], descr, F_COUNT, slot_at);
    if (bad >= 0) {
        for (int k = 0; k < F_COUNT; k++) Py_DECREF(descr[k]);
        PyErr_Format(PyExc_TypeError, "%s is not a __slots__ slot of its own in the class", FIELD_NAMES[bad]);
        return NULL;
    }
    for (int i = 0; i < F_COUNT; i++) {
        Py_XSETREF(S.descr[i], descr[i]);
        S.slot_at[i] = slot_at[i];
    }
    Py_XSETREF(S.request_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(S.system_codes, PyDict_Copy(args[1]));
    if (S.system_codes == NULL) return NULL;
    Py_XSETREF(S.crc_func, args[2] == Py_None ? NULL : Py_NewRef(args[2]));
    S.configured = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(use_crc32_doc,
"use_crc32(address) -> bool\n\n"
"Compute BODYCRC with the C function at ``address`` (an int; 0 turns it off):\n"
"``uint32_t f(uint32_t crc, const unsigned char *buf, uint64_t len)`` giving zlib's crc32, as\n"
"ISA-L's crc32_gzip_refl does. It is first checked against zlib on bytes of 0..4099 lengths;\n"
"False (and nothing changed but the native function turned off) when it disagrees.");

static PyObject *py_use_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "use_crc32(address: int)");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (address == NULL && PyErr_Occurred()) return NULL;
    S.crc_native = NULL;
    if (address == NULL) Py_RETURN_FALSE;
    uint32_t (*fn)(uint32_t, const unsigned char *, uint64_t) =
        (uint32_t (*)(uint32_t, const unsigned char *, uint64_t))address;
    unsigned char sample[4099];
    uint32_t x = 2463534242u; /* xorshift32: any fixed bytes will do */
    for (size_t i = 0; i < sizeof sample; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        sample[i] = (unsigned char)x;
    }
    static const Py_ssize_t lengths[] = {0, 1, 3, 15, 16, 63, 64, 65, 255, 1024, 1031, 4096, 4099};
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        for (Py_ssize_t shift = 0; shift < 4 && lengths[k] + shift <= (Py_ssize_t)sizeof sample; shift++) {
            if (fn(0, sample + shift, (uint64_t)lengths[k]) != crc32_of(sample + shift, lengths[k]))
                Py_RETURN_FALSE;
        }
    }
    S.crc_native = fn;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(configure_record_doc,
"configure_record(record_type, field_names, decode_host) -> None\n\n"
"The MessageRecord class decode_record builds (its 18 slots, in field order) and the function\n"
"that turns an encoded host into (ip, port).");

static PyObject *py_configure_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 18
        || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure_record(record_type, field_names: 18-tuple, decode_host)");
        return NULL;
    }
    PyObject *descr[18];
    for (int i = 0; i < 18; i++) {
        descr[i] = PyObject_GetAttr(args[0], PyTuple_GET_ITEM(args[1], i));
        if (descr[i] == NULL || Py_TYPE(descr[i])->tp_descr_set == NULL) {
            for (int k = 0; k <= i; k++) Py_XDECREF(descr[k]);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a MessageRecord field is not a slot");
            return NULL;
        }
    }
    /* decode_at stores each field where __slots__ keep it: nothing is kept unless all are slots. */
    Py_ssize_t slot_at[18];
    int bad = slot_offsets((PyTypeObject *)args[0], descr, 18, slot_at);
    for (int k = 0; k < 18; k++) Py_DECREF(descr[k]); /* the offsets are the type's layout */
    if (bad >= 0) {
        PyErr_Format(PyExc_TypeError, "MessageRecord field %R is not a __slots__ slot of its own in the class",
                     PyTuple_GET_ITEM(args[1], bad));
        return NULL;
    }
    PyTypeObject *old_type = S.record_type; /* released once the type and offsets agree again */
    S.record_type = (PyTypeObject *)Py_NewRef(args[0]);
    memcpy(S.record_slot_at, slot_at, sizeof slot_at);
    Py_XDECREF(old_type);
    Py_XSETREF(S.decode_host, Py_NewRef(args[2]));
    for (int i = 0; i < HOST_SLOTS; i++) Py_CLEAR(host_cache[i].value); /* decoded by the old one */
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- IndexFile */

/* Java String.hashCode folded on from ``h`` over the UTF-16 code units of the ready str ``u``
 * (as index_hash_of_str: hashing a + b is folding b on from a's hash). */
static uint32_t java_fold(uint32_t h, PyObject *u) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(u);
    int kind = PyUnicode_KIND(u);
    const void *data = PyUnicode_DATA(u);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31u * h + (uint32_t)(0xD800 + (c >> 10));
            h = 31u * h + (uint32_t)(0xDC00 + (c & 0x3FF));
        } else {
            h = 31u * h + (uint32_t)c;
        }
    }
    return h;
}

/* The IndexFile's key hash of a Java hash: its absolute value, 0 when that does not fit an int32. */
static int32_t index_hash_of_java(uint32_t h) {
    int32_t signed_h = (int32_t)h;
    if (signed_h == INT32_MIN) return 0;
    return signed_h < 0 ? -signed_h : signed_h;
}

/* Java String.hashCode over the UTF-16 code units of ``u`` (as libstore.tags.java_string_hash),
   then the IndexFile's key hash: its absolute value, 0 when that does not fit an int32. ``u`` is
   ready (index_hashes checks). A lone surrogate is hashed as the code unit it is, as Java would;
   the Python reference cannot encode one (dispatch never hands it one). */
static int32_t index_hash_of_str(PyObject *u) { return index_hash_of_java(java_fold(0, u)); }

PyDoc_STRVAR(index_hashes_doc,
"index_hashes(keys: list[str]) -> list[int]\n\n"
"The IndexFile key hash of each key: abs(Java String.hashCode), 0 when it overflows\n"
"(libstore.index_file.index_hash_of over libstore.tags.java_string_hashes).");

static PyObject *py_index_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "index_hashes(keys: list[str])");
        return NULL;
    }
    PyObject *keys = args[0];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyUnicode_Check(key)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "index_hashes: keys must be str");
            return NULL;
        }
        if (PyUnicode_READY(key) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *v = PyLong_FromLong(index_hash_of_str(key));
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

PyDoc_STRVAR(message_ids_doc,
"message_ids(store_host: bytes, phy_offsets: list[int]) -> list[str]\n\n"
"libstore.message_id.create_message_id for each offset: (store host + >q offset) as\n"
"uppercase hex. The host is 8 or 20 bytes.");

static PyObject *py_message_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "message_ids(store_host: bytes, phy_offsets: list[int])");
        return NULL;
    }
    Py_ssize_t host_len = PyBytes_GET_SIZE(args[0]);
    if (host_len != 8 && host_len != 20) {
        PyErr_SetString(PyExc_ValueError, "message_ids: the store host is 8 or 20 bytes");
        return NULL;
    }
    const unsigned char *host = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    PyObject *offsets = args[1];
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(offsets, i);
        if (!PyLong_CheckExact(item)) { /* no Python code may run (and change the list) here */
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "message_ids: offsets must be int");
            return NULL;
        }
        long long offset = PyLong_AsLongLong(item);
        if (offset == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *id = hex_id(host, host_len, (int64_t)offset);
        if (id == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, id);
    }
    return out;
}

/* -- Produce / Append replies ------------------------------------------------------------------ */

/* Protobuf varints (the Produce/Append replies here, the record framing below). */
static Py_ssize_t varint_len(unsigned long long v) {
    Py_ssize_t n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A protobuf varint of v (int32/int64/enum values are written as their 64-bit two's complement,
   so a negative one takes 10 bytes); returns the byte after it. */
static unsigned char *put_varint(unsigned char *w, unsigned long long v) {
    while (v > 0x7F) {
        *w++ = (unsigned char)(v & 0x7F) | 0x80;
        v >>= 7;
    }
    *w++ = (unsigned char)v;
    return w;
}

/* The first n items of list as int64 into out (malloc'd by the caller); 0, or -1 with an
   exception set (an item that is not an exact int, or past int64: no Python code runs). */
static int read_int64s(PyObject *list, Py_ssize_t n, long long *out, const char *what) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyLong_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "encode_put_results: %s must be ints", what);
            return -1;
        }
        out[i] = PyLong_AsLongLong(item);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* Bytes of a packed repeated field's payload. */
static Py_ssize_t packed_len(const long long *v, Py_ssize_t n) {
    Py_ssize_t len = 0;
    for (Py_ssize_t i = 0; i < n; i++) len += varint_len((unsigned long long)v[i]);
    return len;
}

static Py_ssize_t scalar_len(long long v) { /* tag byte + varint; 0 when v is the default */
    return v ? 1 + varint_len((unsigned long long)v) : 0;
}

static Py_ssize_t packed_field_len(Py_ssize_t payload) { /* tag byte + length + payload */
    return payload ? 1 + varint_len((unsigned long long)payload) + payload : 0;
}

static unsigned char *put_scalar(unsigned char *w, unsigned char tag, long long v) {
    if (!v) return w;
    *w++ = tag;
    return put_varint(w, (unsigned long long)v);
}

static unsigned char *put_packed(unsigned char *w, unsigned char tag, const long long *v, Py_ssize_t n,
                                 Py_ssize_t payload) {
    if (!payload) return w;
    *w++ = tag;
    w = put_varint(w, (unsigned long long)payload);
    for (Py_ssize_t i = 0; i < n; i++) w = put_varint(w, (unsigned long long)v[i]);
    return w;
}

PyDoc_STRVAR(encode_put_results_doc,
"encode_put_results(count, appended, status, failed_status, phy_offsets, sizes, queue_offsets,\n"
"                   store_timestamp, store_host, unwaited) -> bytes\n\n"
"A reply whose field 1 is mqstore.v1.PutResults (ProduceResponse, AppendResponse), encoded as\n"
"protobuf encodes it: the scalars (int, 0 left out), the lists of ints packed (empty ones left\n"
"out), store_host (bytes, 8 or 20 bytes, or empty) and, when it is not empty, msg_ids: the\n"
"offset message id of each phy offset (libstore.message_id.create_message_id). The lists must\n"
"hold exact ints within int64. Raises TypeError, ValueError (a store host of another length),\n"
"OverflowError.");

static PyObject *py_encode_put_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10 || !PyList_Check(args[4]) || !PyList_Check(args[5]) || !PyList_Check(args[6]) ||
        !PyBytes_Check(args[8]) || !PyList_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_put_results(int, int, int, int, list, list, list, int, bytes, list)");
        return NULL;
    }
    long long scalars[4];
    for (int i = 0; i < 4; i++) {
        scalars[i] = PyLong_AsLongLong(args[i]);
        if (scalars[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long long store_ts = PyLong_AsLongLong(args[7]);
    if (store_ts == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t host_len = PyBytes_GET_SIZE(args[8]);
    if (host_len != 0 && host_len != 8 && host_len != 20) {
        PyErr_SetString(PyExc_ValueError, "encode_put_results: the store host is 8 or 20 bytes");
        return NULL;
    }
    const unsigned char *host = (const unsigned char *)PyBytes_AS_STRING(args[8]);
    Py_ssize_t n_phy = PyList_GET_SIZE(args[4]), n_size = PyList_GET_SIZE(args[5]);
    Py_ssize_t n_qoff = PyList_GET_SIZE(args[6]), n_unw = PyList_GET_SIZE(args[9]);
    Py_ssize_t total_n = n_phy + n_size + n_qoff + n_unw;
    long long *values = PyMem_Malloc(sizeof(long long) * (size_t)(total_n ? total_n : 1));
    if (values == NULL) return PyErr_NoMemory();
    long long *phys = values, *sizes = phys + n_phy, *qoffs = sizes + n_size, *unw = qoffs + n_qoff;
    PyObject *out = NULL;
    if (read_int64s(args[4], n_phy, phys, "phy_offsets") < 0 || read_int64s(args[5], n_size, sizes, "sizes") < 0 ||
        read_int64s(args[6], n_qoff, qoffs, "queue_offsets") < 0 ||
        read_int64s(args[9], n_unw, unw, "unwaited") < 0)
        goto done;
    Py_ssize_t p_phy = packed_len(phys, n_phy), p_size = packed_len(sizes, n_size);
    Py_ssize_t p_qoff = packed_len(qoffs, n_qoff), p_unw = packed_len(unw, n_unw);
    Py_ssize_t id_len = 2 * (host_len + 8);
    Py_ssize_t inner = scalar_len(scalars[0]) + scalar_len(scalars[1]) + scalar_len(scalars[2]) +
                       scalar_len(scalars[3]) + packed_field_len(p_phy) + packed_field_len(p_size) +
                       packed_field_len(p_qoff) + scalar_len(store_ts) +
                       (host_len ? 1 + varint_len((unsigned long long)host_len) + host_len : 0) +
                       (host_len ? n_phy * (1 + varint_len((unsigned long long)id_len) + id_len) : 0) +
                       packed_field_len(p_unw);
    out = PyBytes_FromStringAndSize(NULL, 1 + varint_len((unsigned long long)inner) + inner);
    if (out == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    *w++ = 0x0a; /* field 1: the PutResults */
    w = put_varint(w, (unsigned long long)inner);
    w = put_scalar(w, 1 << 3, scalars[0]);
    w = put_scalar(w, 2 << 3, scalars[1]);
    w = put_scalar(w, 3 << 3, scalars[2]);
    w = put_scalar(w, 4 << 3, scalars[3]);
    w = put_packed(w, 5 << 3 | 2, phys, n_phy, p_phy);
    w = put_packed(w, 6 << 3 | 2, sizes, n_size, p_size);
    w = put_packed(w, 7 << 3 | 2, qoffs, n_qoff, p_qoff);
    w = put_scalar(w, 8 << 3, store_ts);
    if (host_len) {
        *w++ = 9 << 3 | 2;
        w = put_varint(w, (unsigned long long)host_len);
        memcpy(w, host, (size_t)host_len);
        w += host_len;
        for (Py_ssize_t i = 0; i < n_phy; i++) { /* msg_ids */
            *w++ = 10 << 3 | 2;
            w = put_varint(w, (unsigned long long)id_len);
            w = write_hex_id(w, host, host_len, (int64_t)phys[i]);
        }
    }
    w = put_packed(w, 11 << 3 | 2, unw, n_unw, p_unw);
done:
    PyMem_Free(values);
    return out;
}

PyDoc_STRVAR(index_put_run_doc,
"index_put_run(mm, key_hashes, offsets, timestamps, start, stop, count, slot_num, entries_at,\n"
"              begin_timestamp) -> new_slots\n\n"
"IndexFile.put_many's loop: entries start..stop-1 of the three parallel lists (key hashes >= 0,\n"
"CommitLog offsets, store times in ms) are written as entries count, count+1, ... of the file\n"
"mapped by ``mm`` (a writable buffer): hashKey, phyOffset, timeDiff (s since\n"
"begin_timestamp, clamped to 0..INT32_MAX; 0 when begin_timestamp <= 0) and the slot's\n"
"previous entry (0 when the slot is empty or points past ``count``); each key's slot then\n"
"points at its entry. Returns how many slots were empty before. Big-endian, as RocketMQ.");

static PyObject *py_index_put_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10 || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "index_put_run: (mm, list, list, list, 6 ints)");
        return NULL;
    }
    PyObject *hashes = args[1], *offsets = args[2], *timestamps = args[3];
    Py_ssize_t start = PyLong_AsSsize_t(args[4]), stop = PyLong_AsSsize_t(args[5]);
    long long count = PyLong_AsLongLong(args[6]), slot_num = PyLong_AsLongLong(args[7]);
    Py_ssize_t entries_at = PyLong_AsSsize_t(args[8]);
    long long begin = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || stop < start || stop > PyList_GET_SIZE(hashes) || stop > PyList_GET_SIZE(offsets)
        || stop > PyList_GET_SIZE(timestamps) || slot_num <= 0 || count < 0 || entries_at < 40) {
        PyErr_SetString(PyExc_ValueError, "index_put_run: arguments out of range");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    unsigned char *mm = (unsigned char *)view.buf;
    long long new_slots = 0;
    Py_ssize_t n = stop - start;
    /* Bounds in division form, so no product can overflow; entry numbers must fit an int32. */
    if (entries_at > view.len || slot_num > (entries_at - 40) / 4 || count > INT32_MAX - n
        || count > (view.len - entries_at) / 20 - n) {
        PyErr_SetString(PyExc_ValueError, "index_put_run: the entries do not fit the file");
        goto error;
    }
    for (Py_ssize_t k = start; k < stop; k++) {
        /* Exact ints only: a subclass's __index__ could run code that changes the lists. */
        PyObject *h_obj = PyList_GET_ITEM(hashes, k), *p_obj = PyList_GET_ITEM(offsets, k);
        PyObject *t_obj = PyList_GET_ITEM(timestamps, k);
        if (!PyLong_CheckExact(h_obj) || !PyLong_CheckExact(p_obj) || !PyLong_CheckExact(t_obj)) {
            PyErr_SetString(PyExc_TypeError, "index_put_run: hashes, offsets and times are ints");
            goto error;
        }
        long long key_hash = PyLong_AsLongLong(h_obj);
        long long phy = PyLong_AsLongLong(p_obj);
        long long ts = PyLong_AsLongLong(t_obj);
        if (PyErr_Occurred()) goto error;
        if (key_hash < 0 || key_hash > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "index_put_run: key hashes are 0..INT32_MAX");
            goto error;
        }
        unsigned char *slot = mm + 40 + (key_hash % slot_num) * 4;
        long long prev = rd32(slot);
        if (prev <= 0 || prev > count) {
            prev = 0;
            new_slots++;
        }
        long long diff = 0; /* whole seconds after begin, clamped to 0..INT32_MAX */
        if (begin > 0 && ts > begin) {
            diff = (ts - begin) / 1000; /* ts > begin > 0: no overflow */
            diff = diff > INT32_MAX ? INT32_MAX : diff;
        }
        unsigned char *e = mm + entries_at + count * 20;
        wr32(e, (int32_t)key_hash);
        wr64(e + 4, (int64_t)phy);
        wr32(e + 12, (int32_t)diff);
        wr32(e + 16, (int32_t)prev);
        wr32(slot, (int32_t)count);
        count++;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(new_slots);
error:
    PyBuffer_Release(&view);
    return NULL;
}


/* --------------------------------------------------------- transient stubs */

/* Stub properties: the raw entries whose name is one of these (libstore.durability). */
static const char *const STUB_NAMES[] = {"TAGS\x01", "KEYS\x01", "UNIQ_KEY\x01"};
static const Py_ssize_t STUB_NAME_LENS[] = {sizeof "TAGS\x01" - 1, sizeof "KEYS\x01" - 1, sizeof "UNIQ_KEY\x01" - 1};
#define STUB_NAME_COUNT 3

/* Bytes the kept entries of properties [p, p + n) take (each with its \x02); with ``out`` set,
 * writes them there. */
static Py_ssize_t stub_properties(const unsigned char *p, Py_ssize_t n, unsigned char *out) {
    Py_ssize_t kept = 0, at = 0;
    while (at < n) {
        const unsigned char *end = memchr(p + at, 0x02, (size_t)(n - at));
        Py_ssize_t len = end ? (Py_ssize_t)(end - (p + at)) : n - at;
        for (int k = 0; k < STUB_NAME_COUNT; k++) {
            Py_ssize_t name_len = STUB_NAME_LENS[k];
            if (len >= name_len && memcmp(p + at, STUB_NAMES[k], (size_t)name_len) == 0) {
                if (out) {
                    memcpy(out + kept, p + at, (size_t)len);
                    out[kept + len] = 0x02;
                }
                kept += len + 1;
                break;
            }
        }
        at += len + 1;
    }
    return kept;
}

typedef struct {
    Py_ssize_t header, topic_at, topic_field, props_at, props_len, stub_size;
} StubLayout;

/* Where the parts of the encoded record at ``r`` (``size`` bytes) lie; -1 when they do not fit. */
static int stub_layout(const unsigned char *r, Py_ssize_t size, StubLayout *s) {
    if (size < RECORD_OVERHEAD_V1_IPV4 - 2) return -1;
    Header h;
    read_header(r, &h);
    if (h.body_len < 0 || h.header_size + h.body_len + 1 > size) return -1;
    s->header = h.header_size;
    s->topic_at = h.header_size + h.body_len;
    if (h.magic == MAGIC_V2) {
        if (s->topic_at + 2 > size) return -1;
        s->topic_field = 2 + (Py_ssize_t)(uint16_t)rd16(r + s->topic_at);
    } else {
        s->topic_field = 1 + (Py_ssize_t)r[s->topic_at];
    }
    Py_ssize_t len_at = s->topic_at + s->topic_field;
    if (len_at + 2 > size) return -1;
    s->props_at = len_at + 2;
    s->props_len = (Py_ssize_t)(uint16_t)rd16(r + len_at);
    if (s->props_at + s->props_len > size) return -1;
    s->stub_size = s->header + s->topic_field + 2 + stub_properties(r + s->props_at, s->props_len, NULL);
    return 0;
}

/* Writes at ``w`` the stub (libstore.durability) of the record at ``r``, laid out as ``s`` says. */
static void write_stub(unsigned char *w, const unsigned char *r, const StubLayout *s, long stub_flag, long kept_flags) {
    memcpy(w, r, (size_t)s->header);
    wr32(w, (int32_t)s->stub_size);
    wr32(w + 8, 0); /* BODYCRC of the empty body */
    wr32(w + SYS_FLAG_POSITION, (int32_t)((rd32(r + SYS_FLAG_POSITION) & kept_flags) | stub_flag));
    wr32(w + s->header - 4, 0); /* BODYLEN */
    memcpy(w + s->header, r + s->topic_at, (size_t)s->topic_field);
    Py_ssize_t kept = s->stub_size - s->header - s->topic_field - 2;
    w[s->header + s->topic_field] = (unsigned char)(kept >> 8);
    w[s->header + s->topic_field + 1] = (unsigned char)kept;
    stub_properties(r + s->props_at, s->props_len, w + s->header + s->topic_field + 2);
}

PyDoc_STRVAR(split_transient_doc,
"split_transient(buf, positions, sizes, queue_keys, transient_topics, marked, system_topics,\n"
"                requests, stub_flag, kept_flags)\n"
"    -> None | index | (stub_buf, found, whole_at, whole_bytes)\n\n"
"libstore.durability._split_py: which records of a batch are transient (their topic is in\n"
"``transient_topics``, or, for records of ``marked`` whose topic is not in ``system_topics``,\n"
"their DURABILITY property is 1). None when none is; the index of the first marked record whose\n"
"DURABILITY value is neither 1 nor 2 (nothing is changed then); else a new batch buffer with\n"
"each transient record replaced by its stub (their whole records stay where they are in\n"
"``buf``: record ``i`` at ``whole_at[i]``, a dict in record order, ``whole_bytes`` in all), and ``positions``,\n"
"``sizes`` and the ``requests`` (when there is one per record: msg_size and sys_flag) updated\n"
"in place.\n"
"NotImplemented when a record does not parse.");

static PyObject *py_split_transient(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (need_configured() < 0) return NULL;
    if (nargs != 10 || !PyByteArray_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])
        || !PyList_Check(args[3]) || !PyAnySet_Check(args[4]) || !PyList_Check(args[5]) || !PyAnySet_Check(args[6])
        || !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "split_transient(bytearray, list, list, list, frozenset, list, frozenset, list, int, int)");
        return NULL;
    }
    PyObject *positions = args[1], *sizes = args[2], *queue_keys = args[3], *topics = args[4];
    PyObject *marked = args[5], *system_topics = args[6], *requests = args[7];
    long stub_flag = PyLong_AsLong(args[8]), kept_flags = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(sizes), nm = PyList_GET_SIZE(marked);
    if (PyList_GET_SIZE(positions) != n + 1 || PyList_GET_SIZE(queue_keys) != n) {
        PyErr_SetString(PyExc_ValueError, "split_transient: positions, sizes and queue_keys do not match");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
    Py_ssize_t buf_len = PyByteArray_GET_SIZE(args[0]);
    int with_requests = PyList_GET_SIZE(requests) == n;
    char *is_transient = PyMem_Calloc((size_t)(n ? n : 1), 1);
    StubLayout *lay = PyMem_Malloc(sizeof(StubLayout) * (size_t)(n ? n : 1));
    PyObject *out = NULL, *found = NULL, *whole_at = NULL, *result = NULL;
    if (is_transient == NULL || lay == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = 0;
    if (PySet_GET_SIZE(topics)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *key = PyList_GET_ITEM(queue_keys, i);
            if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1) continue; /* no queue: persistent */
            int in = PySet_Contains(topics, PyTuple_GET_ITEM(key, 0));
            if (in < 0) goto done;
            is_transient[i] = (char)in;
        }
    }
    for (Py_ssize_t m = 0; m < nm; m++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(marked, m));
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "split_transient: a marked record outside the batch");
            goto done;
        }
        PyObject *key = PyList_GET_ITEM(queue_keys, i);
        if (is_transient[i] || !PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1) continue;
        int system = PySet_Contains(system_topics, PyTuple_GET_ITEM(key, 0));
        if (system < 0) goto done;
        if (system) continue; /* the store's own records are persistent */
        Py_ssize_t pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) goto done;
        StubLayout probe;
        if (pos < 0 || size < 0 || pos + size > buf_len || stub_layout(buf + pos, size, &probe) < 0) goto cannot;
        Found f;
        find_properties(buf + pos + probe.props_at, probe.props_len, NULL, 0, &f);
        if (!f.durability) continue; /* absent, or only empty values: persistent */
        const unsigned char *v = f.durability_value;
        if (f.durability_len != 1 || (v[0] != '1' && v[0] != '2')) { /* refused, in Python's words */
            result = PyLong_FromSsize_t(i);
            goto done;
        }
        is_transient[i] = v[0] == '1';
    }
    Py_ssize_t stub_total = buf_len, whole_total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_transient[i]) continue;
        Py_ssize_t pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) goto done;
        if (pos < 0 || size < 0 || pos + size > buf_len || stub_layout(buf + pos, size, &lay[i]) < 0
            || lay[i].stub_size > size)
            goto cannot;
        stub_total -= size - lay[i].stub_size;
        whole_total += size;
        count++;
    }
    if (count == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, stub_total);
    found = PyList_New(0);
    whole_at = PyDict_New();
    if (out == NULL || found == NULL || whole_at == NULL) goto done;
    {
        unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
        /* written: where record i starts in ``out``; [done_to, pos) of ``buf`` (records kept as
         * they are) is copied to out_done when the next stub comes, and after the loop. */
        Py_ssize_t done_to = 0, out_done = 0, written = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
            Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
            if (written != pos) {
                PyObject *new_pos = PyLong_FromSsize_t(written);
                if (new_pos == NULL) goto done;
                PyList_SetItem(positions, i, new_pos);
            }
            if (!is_transient[i]) {
                written += size;
                continue;
            }
            const StubLayout *st = &lay[i];
            memcpy(dst + out_done, buf + done_to, (size_t)(pos - done_to));
            write_stub(dst + written, buf + pos, st, stub_flag, kept_flags);
            PyObject *i_obj = PyLong_FromSsize_t(i), *at_obj = PyLong_FromSsize_t(pos);
            int failed = i_obj == NULL || at_obj == NULL || PyList_Append(found, i_obj) < 0
                         || PyDict_SetItem(whole_at, i_obj, at_obj) < 0;
            Py_XDECREF(i_obj);
            Py_XDECREF(at_obj);
            if (failed) goto done;
            PyObject *new_size = PyLong_FromSsize_t(st->stub_size);
            if (new_size == NULL) goto done;
            PyList_SetItem(sizes, i, new_size);
            if (with_requests) {
                PyObject *req = PyList_GET_ITEM(requests, i);
                int32_t flag = (int32_t)((rd32(buf + pos + SYS_FLAG_POSITION) & kept_flags) | stub_flag);
                if (set_field(req, F_MSG_SIZE, PyLong_FromSsize_t(st->stub_size)) < 0
                    || set_field(req, F_SYS_FLAG, PyLong_FromLong(flag)) < 0)
                    goto done;
            }
            written += st->stub_size;
            out_done = written;
            done_to = pos + size;
        }
        memcpy(dst + out_done, buf + done_to, (size_t)(buf_len - done_to));
        PyObject *end = PyLong_FromSsize_t(stub_total);
        if (end == NULL) goto done;
        PyList_SetItem(positions, n, end);
    }
    result = Py_BuildValue("(OOOn)", out, found, whole_at, whole_total);
    goto done;
cannot:
    result = Py_NewRef(Py_NotImplemented);
done:
    PyMem_Free(is_transient);
    PyMem_Free(lay);
    Py_XDECREF(out);
    Py_XDECREF(found);
    Py_XDECREF(whole_at);
    return result;
}

PyDoc_STRVAR(hold_entries_doc,
"hold_entries(buf, positions, ts_positions, whole_buf, transient, start, stop, delta, min_view_bytes)\n"
"    -> (keys, ends, data)\n\n"
"``keys`` and ``ends`` are array('q').\n"
"libstore.durability._hold_entries_py: the stub offsets of the records of ``transient`` (record\n"
"index -> position in ``whole_buf``, ascending) within [start, stop), and their whole records\n"
"one after another in ``data`` (record i ends at ``ends[i]``), each with the QUEUEOFFSET,\n"
"PHYSICALOFFSET and STORETIMESTAMP of its stub in ``buf`` (at ``positions[index]``, CommitLog\n"
"offset position + ``delta``). When the records are all of ``whole_buf``, back to back, and\n"
"at least ``min_view_bytes`` long, they are patched there and ``data`` is a read-only view of\n"
"it; else ``data`` is new bytes.");

/* One record of hold_entries: where its whole record and its stub are. */
typedef struct {
    Py_ssize_t at, size, pos, ts_at;
} Held;

static PyObject *py_hold_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyByteArray_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])
        || !PyByteArray_Check(args[3]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "hold_entries(bytearray, list, list, bytearray, dict, int, int, int, int)");
        return NULL;
    }
    PyObject *positions = args[1], *ts_positions = args[2], *transient = args[4];
    Py_ssize_t start = PyLong_AsSsize_t(args[5]), stop = PyLong_AsSsize_t(args[6]);
    long long delta = PyLong_AsLongLong(args[7]);
    Py_ssize_t min_view = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *whole = (const unsigned char *)PyByteArray_AS_STRING(args[3]);
    Py_ssize_t whole_len = PyByteArray_GET_SIZE(args[3]), buf_len = PyByteArray_GET_SIZE(args[0]);
    Py_ssize_t room = PyDict_GET_SIZE(transient) + 1;
    Held *held = PyMem_Malloc(sizeof(Held) * (size_t)room);
    int64_t *key_at = PyMem_Malloc(sizeof(int64_t) * (size_t)room);
    int64_t *end_at = PyMem_Malloc(sizeof(int64_t) * (size_t)room);
    PyObject *keys = NULL, *ends = NULL, *data = NULL;
    if (held == NULL || key_at == NULL || end_at == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    /* First pass: check every record and add up the sizes; the dict keeps insertion order,
       which is ascending record order. */
    Py_ssize_t n = 0, total = 0, it = 0;
    PyObject *key, *value;
    while (PyDict_Next(transient, &it, &key, &value)) {
        Py_ssize_t k = PyLong_AsSsize_t(key);
        Py_ssize_t at = k == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(value);
        if (PyErr_Occurred()) goto error;
        if (k < start || k >= stop) continue;
        if (k >= PyList_GET_SIZE(positions) || k >= PyList_GET_SIZE(ts_positions)) {
            PyErr_SetString(PyExc_IndexError, "hold_entries: a record index outside the batch");
            goto error;
        }
        Held *h = &held[n];
        h->at = at;
        h->pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, k));
        h->ts_at = PyLong_AsSsize_t(PyList_GET_ITEM(ts_positions, k));
        if (PyErr_Occurred()) goto error;
        if (at < 0 || at + 8 > whole_len) goto outside;
        h->size = rd32(whole + at);
        if (h->pos < 0 || h->ts_at < 36 || h->pos + h->ts_at + 8 > buf_len || h->size < h->ts_at + 8
            || at + h->size > whole_len)
            goto outside;
        total += h->size;
        n++;
    }
    /* In place only when the records are all of whole_buf: a view keeps the whole buffer alive,
     * and the store counts only the bytes it holds. Below min_view bytes a copy costs less than
     * the view (and is not an object the garbage collector tracks). */
    int in_place = n > 0 && held[0].at == 0 && total == whole_len && total >= min_view;
    for (Py_ssize_t i = 1; i < n && in_place; i++) in_place = held[i].at == held[i - 1].at + held[i - 1].size;
    unsigned char *w;
    if (in_place) {
        w = (unsigned char *)PyByteArray_AS_STRING(args[3]) + held[0].at;
    } else {
        data = PyBytes_FromStringAndSize(NULL, total);
        if (data == NULL) goto error;
        w = (unsigned char *)PyBytes_AS_STRING(data);
    }
    {
        const unsigned char *stubs = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
        Py_ssize_t end = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            const Held *h = &held[i];
            const unsigned char *stub = stubs + h->pos;
            if (!in_place) memcpy(w, whole + h->at, (size_t)h->size);
            memcpy(w + 20, stub + 20, 16); /* QUEUEOFFSET, PHYSICALOFFSET */
            memcpy(w + h->ts_at, stub + h->ts_at, 8); /* STORETIMESTAMP */
            w += h->size;
            end += h->size;
            key_at[i] = (int64_t)(h->pos + delta);
            end_at[i] = (int64_t)end;
        }
    }
    keys = int64_array(key_at, n);
    ends = keys == NULL ? NULL : int64_array(end_at, n);
    if (ends == NULL) goto error;
    if (in_place) {
        /* held[0].at is 0 and total the buffer's length: the view is of all of it */
        PyObject *view = PyMemoryView_FromObject(args[3]);
        data = view == NULL ? NULL : PyObject_CallMethodNoArgs(view, S.n_toreadonly);
        Py_XDECREF(view);
        if (data == NULL) goto error;
    }
    PyMem_Free(held);
    PyMem_Free(key_at);
    PyMem_Free(end_at);
    {
        PyObject *result = PyTuple_Pack(3, keys, ends, data);
        Py_DECREF(keys);
        Py_DECREF(ends);
        Py_DECREF(data);
        return result;
    }
outside:
    PyErr_SetString(PyExc_ValueError, "hold_entries: a record lies outside its buffer");
error:
    PyMem_Free(held);
    PyMem_Free(key_at);
    PyMem_Free(end_at);
    Py_XDECREF(keys);
    Py_XDECREF(ends);
    Py_XDECREF(data);
    return NULL;
}

/* ---- frame_run: records read out of a segment, framed as a protobuf repeated bytes field ---- */

PyDoc_STRVAR(frame_run_doc,
"frame_run(buf, base, readable, ranges, start, tag, stub_byte, stub_bit, max_record_size,\n"
"          max_bytes, total) -> (bytes, next, total)\n\n"
"From ranges[start] on ((offset, size) tuples of ints, offsets into the log), the records of\n"
"one segment mapped as buf (its first byte at log offset base, readable up to log offset\n"
"readable), each framed as a length-delimited protobuf field with the one-byte tag: tag,\n"
"varint size, the record. Stops at the first range it leaves to the caller: not a 2-tuple of\n"
"ints, outside [base, readable), size <= 0 or > max_record_size (0: no bound), a transient\n"
"stub (record byte stub_byte has stub_bit set), or a record that would take the running\n"
"total past max_bytes (0: no bound). next is that range's index (len(ranges) when none);\n"
"total, the record bytes framed so far, this call's included.\n"
"libstore.log_reads.read_records_framed is the caller.");

static int frame_range(PyObject *item, long long *offset, long long *size) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) return 0;
    PyObject *o = PyTuple_GET_ITEM(item, 0), *z = PyTuple_GET_ITEM(item, 1);
    if (!PyLong_Check(o) || !PyLong_Check(z)) return 0; /* ints only: no __index__ runs */
    *offset = PyLong_AsLongLong(o);
    *size = PyLong_AsLongLong(z);
    if (PyErr_Occurred()) {
        PyErr_Clear(); /* past int64: the caller's path says what is wrong */
        return 0;
    }
    return 1;
}

static PyObject *py_frame_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "frame_run(buffer, int, int, list, int, int, int, int, int, int, int)");
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[1]), readable = PyLong_AsLongLong(args[2]);
    Py_ssize_t start = PyLong_AsSsize_t(args[4]);
    long tag = PyLong_AsLong(args[5]), stub_byte = PyLong_AsLong(args[6]), stub_bit = PyLong_AsLong(args[7]);
    long long max_record = PyLong_AsLongLong(args[8]), max_bytes = PyLong_AsLongLong(args[9]);
    long long total = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    if (tag < 0 || tag > 0x7F || stub_byte < 0 || base < 0) {
        PyErr_SetString(PyExc_OverflowError, "frame_run: a tag is one byte below 0x80; positions are >= 0");
        return NULL;
    }
    PyObject *ranges = args[3];
    Py_ssize_t n = PyList_GET_SIZE(ranges);
    if (start < 0) start = 0;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    long long limit = readable - base < (long long)view.len ? readable : base + (long long)view.len;
    Py_ssize_t end = start, out_len = 0;
    long long run_total = total;
    /* Pass 1: how far, and how many bytes. No Python code runs until pass 2 is done (the ranges
       are exact ints read with the GIL held), so pass 2 reads the same values. */
    for (; end < n; end++) {
        long long offset, size;
        if (!frame_range(PyList_GET_ITEM(ranges, end), &offset, &size)) break;
        if (offset < base || offset >= limit || size <= 0 || size > limit - offset) break;
        if (max_record > 0 && size > max_record) break;
        const unsigned char *r = buf + (offset - base);
        if (size > stub_byte && (r[stub_byte] & stub_bit)) break;
        if (max_bytes > 0 && size > max_bytes - run_total) break;
        run_total += size;
        out_len += 1 + varint_len((unsigned long long)size) + (Py_ssize_t)size;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_len);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = start; i < end; i++) { /* pass 2: the same ranges, checked above */
        long long offset = 0, size = 0;
        frame_range(PyList_GET_ITEM(ranges, i), &offset, &size);
        *w++ = (unsigned char)tag;
        w = put_varint(w, (unsigned long long)size);
        memcpy(w, buf + (offset - base), (size_t)size);
        w += size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnL)", out, end, run_total);
}

/* Reads one framed value's header at *pos: tag byte, then a varint length (at most 10 bytes).
   Returns the length, or -1 when the header is cut short, too long or the value overruns. */
static long long framed_value(const unsigned char *b, Py_ssize_t len, Py_ssize_t *pos, int *tag_seen) {
    Py_ssize_t p = *pos;
    if (p >= len) return -1;
    *tag_seen = b[p++];
    unsigned long long v = 0;
    for (int shift = 0;; shift += 7) {
        if (p >= len || shift > 63) return -1;
        unsigned char c = b[p++];
        v |= (unsigned long long)(c & 0x7F) << shift;
        if (c < 0x80) break;
    }
    if (v > (unsigned long long)(len - p)) return -1;
    *pos = p + (Py_ssize_t)v;
    return (long long)v;
}

PyDoc_STRVAR(framed_starts_doc,
"framed_starts(buf, tag, count) -> (starts, value_bytes) | None\n\n"
"Walks buf as a run of length-delimited protobuf values: when it holds exactly count values,\n"
"each with the one-byte tag and none empty, the position of each one's tag byte plus the end\n"
"(count + 1 positions) and the bytes of the values together; else None (a missing record is\n"
"framed empty). libstore.record_framing.value_starts.");

static PyObject *py_framed_starts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "framed_starts(buffer, int, int)");
        return NULL;
    }
    long tag = PyLong_AsLong(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, pos = 0, i = 0;
    long long payload = 0;
    PyObject *starts = count >= 0 ? PyList_New(count + 1) : NULL;
    if (starts == NULL) {
        PyBuffer_Release(&view);
        if (!PyErr_Occurred()) Py_RETURN_NONE;
        return NULL;
    }
    for (; pos < len; i++) {
        Py_ssize_t at = pos;
        int seen;
        long long size = framed_value(b, len, &pos, &seen);
        if (size <= 0 || seen != tag || i >= count) goto mismatch;
        PyObject *v = PyLong_FromSsize_t(at);
        if (v == NULL) goto fail;
        PyList_SET_ITEM(starts, i, v);
        payload += size;
    }
    if (i != count) goto mismatch;
    PyObject *end = PyLong_FromSsize_t(len);
    if (end == NULL) goto fail;
    PyList_SET_ITEM(starts, count, end);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NL)", starts, payload);
mismatch:
    PyBuffer_Release(&view);
    Py_DECREF(starts); /* unset items are NULL: list_dealloc skips them */
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    Py_DECREF(starts);
    return NULL;
}

PyDoc_STRVAR(retag_doc,
"retag(framed, tag) -> count\n\n"
"Gives every length-delimited protobuf value in the bytearray framed the one-byte tag, in\n"
"place (lengths unchanged); the number of values. ValueError, framed unchanged, when it is\n"
"not such a run of values. libstore.record_framing.retag.");

static PyObject *py_retag(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyByteArray_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "retag(bytearray, int)");
        return NULL;
    }
    long tag = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (tag < 0 || tag > 0x7F) {
        PyErr_SetString(PyExc_ValueError, "retag: a tag is one byte below 0x80");
        return NULL;
    }
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(args[0]);
    Py_ssize_t len = PyByteArray_GET_SIZE(args[0]), pos = 0, count = 0;
    int seen;
    while (pos < len) { /* check the whole run before writing */
        if (framed_value(b, len, &pos, &seen) < 0) {
            PyErr_SetString(PyExc_ValueError, "retag: not a run of length-delimited values");
            return NULL;
        }
        count++;
    }
    for (pos = 0; pos < len;) {
        b[pos] = (unsigned char)tag;
        framed_value(b, len, &pos, &seen);
    }
    return PyLong_FromSsize_t(count);
}

/* ------------------------------------------------------------ dispatch runs */

/* A slot of a DispatchRequest (exactly that type: the caller checks), read where __slots__ keep
 * it: a borrowed reference, NULL when the slot is unset. */
static inline PyObject *req_get(PyObject *req, int field) {
    return *(PyObject **)((char *)req + S.slot_at[field]);
}

/* An int slot of a DispatchRequest into *out; -1 (an exception set) when unset or not an int
 * that fits. Exact ints only, as the Python code's arithmetic would see them. */
static int req_int(PyObject *req, int field, long long *out) {
    PyObject *v = req_get(req, field);
    if (v == NULL || !PyLong_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "not an int");
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(queue_runs_doc,
"queue_runs(requests: list[DispatchRequest], with_units: bool) -> list[tuple] | NotImplemented\n\n"
"libstore.queue_runs.queue_runs in C: the requests that take a queue offset, grouped by queue\n"
"in order of first appearance. NotImplemented for anything but DispatchRequests with int\n"
"fields and str topics (the Python code then answers).");

typedef struct {
    PyObject *topic;   /* borrowed from the requests (the members list holds them) */
    long long queue_id;
    PyObject *members; /* a new list */
} Run;

static PyObject *py_queue_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "queue_runs(requests: list, with_units: bool)");
        return NULL;
    }
    if (!S.configured) Py_RETURN_NOTIMPLEMENTED;
    int with_units = PyObject_IsTrue(args[1]);
    if (with_units < 0) return NULL;
    PyObject *requests = args[0];
    /* The queues met so far, in order: a chunk names a few (its producers' queues), so a scan
     * from the last one met costs less than a dict keyed by (topic, queue id) tuples. */
    Py_ssize_t count = 0, room = 16, last_hit = 0;
    Run *runs = PyMem_Malloc(room * sizeof(Run));
    PyObject *out = NULL;
    if (runs == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(requests); i++) {
        PyObject *req = PyList_GET_ITEM(requests, i);
        long long sys_flag, queue_id;
        if (Py_TYPE(req) != S.request_type || req_int(req, F_SYS_FLAG, &sys_flag) < 0) goto fallback;
        if (sys_flag & TX_NO_QUEUE_OFFSET) continue;
        PyObject *topic = req_get(req, F_TOPIC);
        if (topic == NULL || !PyUnicode_CheckExact(topic) || req_int(req, F_QUEUE_ID, &queue_id) < 0)
            goto fallback;
        Run *run = NULL;
        for (Py_ssize_t k = 0; k < count; k++) {
            Run *r = &runs[(last_hit + k) % count];
            if (r->queue_id == queue_id && (r->topic == topic || PyUnicode_Compare(r->topic, topic) == 0)) {
                run = r;
                last_hit = (last_hit + k) % count;
                break;
            }
        }
        if (PyErr_Occurred()) goto error;
        if (run == NULL) {
            if (count == room) {
                Run *grown = PyMem_Realloc(runs, 2 * room * sizeof(Run));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto error;
                }
                runs = grown;
                room *= 2;
            }
            PyObject *members = PyList_New(0);
            if (members == NULL) goto error;
            run = &runs[count];
            run->topic = topic;
            run->queue_id = queue_id;
            run->members = members;
            last_hit = count++;
        }
        if (PyList_Append(run->members, req) < 0) goto error;
    }
    out = PyList_New(count);
    if (out == NULL) goto error;
    for (Py_ssize_t r = 0; r < count; r++) {
        PyObject *members = runs[r].members;
        Py_ssize_t n = PyList_GET_SIZE(members);
        PyObject *units = NULL;
        unsigned char *w = NULL;
        long long first = 0, last = 0, first_end = 0, last_end = 0, last_stub = -1;
        int consecutive = 1;
        if (with_units) {
            units = PyBytes_FromStringAndSize(NULL, n * 20);
            if (units == NULL) goto error;
            w = (unsigned char *)PyBytes_AS_STRING(units);
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *req = PyList_GET_ITEM(members, k);
            long long qoff, flag, phy = 0, size = 0, code = 0;
            if (req_int(req, F_CONSUME_QUEUE_OFFSET, &qoff) < 0 || req_int(req, F_SYS_FLAG, &flag) < 0
                || (with_units
                    && (req_int(req, F_COMMIT_LOG_OFFSET, &phy) < 0 || req_int(req, F_MSG_SIZE, &size) < 0
                        || req_int(req, F_TAGS_CODE, &code) < 0 || size < INT32_MIN || size > INT32_MAX))) {
                Py_XDECREF(units);
                goto fallback;
            }
            if (k == 0) {
                first = qoff;
                first_end = phy + size;
            } else if (qoff != first + k) {
                consecutive = 0;
            }
            last = qoff;
            last_end = phy + size;
            if (flag & TRANSIENT_STUB) last_stub = qoff;
            if (w != NULL) {
                wr64(w, (int64_t)phy);
                wr32(w + 8, (int32_t)size);
                wr64(w + 12, (int64_t)code);
                w += 20;
            }
        }
        if (!consecutive) Py_CLEAR(units);
        PyObject *run = Py_BuildValue("(OLLLLLNOL)", runs[r].topic, runs[r].queue_id, first, last, first_end,
                                      last_end, units != NULL ? units : Py_NewRef(Py_None), members, last_stub);
        if (run == NULL) goto error;
        PyList_SET_ITEM(out, r, run);
    }
    for (Py_ssize_t r = 0; r < count; r++) Py_DECREF(runs[r].members);
    PyMem_Free(runs);
    return out;
fallback:
    PyErr_Clear();
    for (Py_ssize_t r = 0; r < count; r++) Py_DECREF(runs[r].members);
    PyMem_Free(runs);
    Py_XDECREF(out);
    Py_RETURN_NOTIMPLEMENTED;
error:
    for (Py_ssize_t r = 0; r < count; r++) Py_DECREF(runs[r].members);
    PyMem_Free(runs);
    Py_XDECREF(out);
    return NULL;
}

PyDoc_STRVAR(index_entries_doc,
"index_entries(requests: list[DispatchRequest], last: int)\n"
"    -> (hashes, offsets, timestamps, last) | NotImplemented\n\n"
"libstore.index_service.index_entries in C: the IndexFile entries of the records after CommitLog\n"
"offset ``last`` (``topic#UNIQ_KEY`` and ``topic#key`` per KEYS token; no ROLLBACK record), their\n"
"key hashes computed without building the keys. NotImplemented for anything but\n"
"DispatchRequests with int fields, str topic and keys, and a tuple of keys.");

static PyObject *py_index_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "index_entries(requests: list, last: int)");
        return NULL;
    }
    if (!S.configured) Py_RETURN_NOTIMPLEMENTED;
    long long last = PyLong_AsLongLong(args[1]);
    if (last == -1 && PyErr_Occurred()) { /* past 64 bits: the Python code answers */
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *requests = args[0];
    PyObject *prefix_of = NULL; /* the topic whose "topic#" hash is in prefix (borrowed) */
    uint32_t prefix = 0;
    PyObject *hashes = PyList_New(0), *offsets = PyList_New(0), *timestamps = PyList_New(0);
    if (hashes == NULL || offsets == NULL || timestamps == NULL) goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(requests); i++) {
        PyObject *req = PyList_GET_ITEM(requests, i);
        long long offset, sys_flag, ts;
        if (Py_TYPE(req) != S.request_type || req_int(req, F_COMMIT_LOG_OFFSET, &offset) < 0
            || req_int(req, F_SYS_FLAG, &sys_flag) < 0)
            goto fallback;
        if (offset <= last || (sys_flag & 0xC) == 0xC) continue; /* a replay; ROLLBACK */
        PyObject *uniq = req_get(req, F_UNIQ_KEY), *keys = req_get(req, F_KEYS), *topic = req_get(req, F_TOPIC);
        int bad = uniq == NULL || keys == NULL || topic == NULL || !PyTuple_CheckExact(keys)
                  || !PyUnicode_CheckExact(topic) || (uniq != Py_None && !PyUnicode_CheckExact(uniq));
        for (Py_ssize_t k = 0; !bad && k < PyTuple_GET_SIZE(keys); k++)
            bad = !PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, k)) || PyUnicode_READY(PyTuple_GET_ITEM(keys, k)) < 0;
        bad = bad || PyUnicode_READY(topic) < 0 || (uniq != Py_None && PyUnicode_READY(uniq) < 0);
        int has_uniq = !bad && uniq != Py_None && PyUnicode_GET_LENGTH(uniq) > 0;
        if (bad || (!has_uniq && PyTuple_GET_SIZE(keys) == 0) || req_int(req, F_STORE_TIMESTAMP, &ts) < 0) {
            if (bad || PyErr_Occurred()) goto fallback;
            continue; /* nothing to index */
        }
        if (topic != prefix_of) { /* a chunk's records mostly share their topic (object) */
            prefix_of = topic;
            prefix = 31u * java_fold(0, topic) + (uint32_t)'#';
        }
        PyObject *off_obj = PyLong_FromLongLong(offset), *ts_obj = PyLong_FromLongLong(ts);
        int rc = off_obj == NULL || ts_obj == NULL ? -1 : 0;
        Py_ssize_t total = PyTuple_GET_SIZE(keys) + (has_uniq ? 1 : 0);
        for (Py_ssize_t k = 0; rc == 0 && k < total; k++) {
            PyObject *part = has_uniq ? (k == 0 ? uniq : PyTuple_GET_ITEM(keys, k - 1)) : PyTuple_GET_ITEM(keys, k);
            PyObject *h = PyLong_FromLong(index_hash_of_java(java_fold(prefix, part)));
            rc = h == NULL ? -1 : PyList_Append(hashes, h);
            Py_XDECREF(h);
            if (rc == 0) rc = PyList_Append(offsets, off_obj);
            if (rc == 0) rc = PyList_Append(timestamps, ts_obj);
        }
        Py_XDECREF(off_obj);
        Py_XDECREF(ts_obj);
        if (rc < 0) goto error;
        last = offset;
    }
    PyObject *new_last = PyLong_FromLongLong(last);
    if (new_last == NULL) goto error;
    return Py_BuildValue("(NNNN)", hashes, offsets, timestamps, new_last);
fallback:
    PyErr_Clear();
    Py_XDECREF(hashes);
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_RETURN_NOTIMPLEMENTED;
error:
    Py_XDECREF(hashes);
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    return NULL;
}

PyDoc_STRVAR(record_cuts_doc,
"record_cuts(buf, base_offset, every) -> (positions, end)\n\n"
"services.spark.commitlog_source's cut points in C: walks the records of ``buf`` (one CommitLog\n"
"file, from ``base_offset``) from its start, each checked as check_record checks it without the\n"
"CRC and the properties (PHYSICALOFFSET included), and lists where the first record at or past\n"
"``every`` bytes from the last cut (0 to begin with) starts. Stops at the zero tail, a blank END\n"
"record, the first bytes that are not such a record (``end``: where it stopped), or once the\n"
"next cut would fall past the end of ``buf`` (``end``: where the last cut starts).");

static PyObject *py_record_cuts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record_cuts(buf, base_offset, every)");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    long long base = PyLong_AsLongLong(args[1]);
    Py_ssize_t every = PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (every <= 0) {
        PyErr_SetString(PyExc_ValueError, "record_cuts: every must be positive");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, pos = 0, due = every;
    PyObject *cuts = PyList_New(0);
    while (cuts != NULL && pos + 8 <= len) {
        if (rd32(buf + pos) == 0 && rd32(buf + pos + 4) == 0) break; /* the unwritten tail */
        Checked checked;
        PyObject *res = check_one(buf, pos, len, 0, base + pos, 0, 0, 0, &checked, 0);
        if (res == NULL) {
            Py_CLEAR(cuts);
            break;
        }
        if (res != Py_None) { /* not a record, or a blank END record (FALLBACK is borrowed) */
            if (res != FALLBACK) Py_DECREF(res);
            break;
        }
        Py_DECREF(res);
        Py_DECREF(checked.topic);
        if (pos >= due) {
            PyObject *at = PyLong_FromSsize_t(pos);
            if (at == NULL || PyList_Append(cuts, at) < 0) {
                Py_XDECREF(at);
                Py_CLEAR(cuts);
                break;
            }
            Py_DECREF(at);
            due = pos + every;
            if (due >= len) break; /* no cut left to find */
        }
        pos += checked.header.total;
    }
    PyBuffer_Release(&view);
    return cuts == NULL ? NULL : Py_BuildValue("(Nn)", cuts, pos);
}

PyDoc_STRVAR(scan_run_doc,
"scan_run(buf, pos, base_offset, decode_properties) -> (records, pos, state, bad)\n\n"
"log_scanner.scan_buffer's loop in C, from ``pos`` of ``buf`` (CommitLog bytes from\n"
"``base_offset``): the records check_record accepts (no CRC), one after another, until\n"
"``state`` says why it stopped at ``pos``: 0 the end of ``buf``, 1 a blank END record, 2 bytes\n"
"that are not a record (``bad``: their request, commit_log_offset set to where they sit), 3 a\n"
"record only the Python code decodes (check_record's fallback: it takes that one).");

static PyObject *py_scan_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan_run(buf, pos, base_offset, decode_properties)");
        return NULL;
    }
    if (need_configured() < 0) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long base = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int decode = PyObject_IsTrue(args[3]);
    if (decode < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t limit = view.len;
    PyObject *records = PyList_New(0), *bad = NULL;
    int state = 0;
    if (records == NULL) goto error;
    if (pos < 0 || pos > limit || base < 0) {
        PyErr_SetString(PyExc_ValueError, "scan_run: pos or base_offset out of range");
        goto error;
    }
    while (pos < limit) {
        PyObject *checked = check_one(buf, pos, limit, 0, base + pos, decode, 0, 0, NULL, 1);
        if (checked == NULL) goto error;
        if (checked == FALLBACK) { /* borrowed */
            state = 3;
            break;
        }
        PyObject *req = PyTuple_GET_ITEM(checked, 0);
        long long size;
        int rc = req_int(req, F_MSG_SIZE, &size);
        if (rc == 0 && req_get(req, F_SUCCESS) != Py_True) {
            rc = set_field(req, F_COMMIT_LOG_OFFSET, PyLong_FromLongLong(base + pos));
            bad = rc == 0 ? Py_NewRef(req) : NULL;
            state = 2;
        } else if (rc == 0 && size == 0) {
            state = 1;
        } else if (rc == 0) {
            rc = PyList_Append(records, req);
            pos += (Py_ssize_t)size;
        }
        Py_DECREF(checked);
        if (rc < 0) goto error;
        if (state) break;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NniN)", records, pos, state, bad != NULL ? bad : Py_NewRef(Py_None));
error:
    PyBuffer_Release(&view);
    Py_XDECREF(records);
    Py_XDECREF(bad);
    return NULL;
}

/* ------------------------------------------------------------ dedup index */

/* The key index of services.commitlog.dedup_window (its _DictIndex is the reference): which
   ring slot holds a key's newest put. Open addressing with linear probing over a bytearray of
   8-byte slots, a power of two of them, at most half full: the low 32 bits of the key's hash
   (its tag, which also gives its home slot) and the ring slot, DEDUP_EMPTY when free. A miss
   costs one or two probes in adjacent slots (one or two cache lines) where a dict of the
   window's 200,000 keys, with the dummies its deletions leave, took several; a tag that
   matches is confirmed by comparing the key with the ring's. Deletion shifts the entries
   after it back (no tombstones), so probe runs stay as short as the load allows. */
#define DEDUP_EMPTY 0xFFFFFFFFu

typedef struct {
    uint32_t tag;
    uint32_t slot;
} DedupSlot;

static int dedup_args(PyObject *table, PyObject *ring_keys, DedupSlot **t, uint32_t *mask) {
    if (!PyByteArray_Check(table) || !PyList_Check(ring_keys)) {
        PyErr_SetString(PyExc_TypeError, "the dedup index takes a bytearray table and the ring's key list");
        return -1;
    }
    Py_ssize_t n = PyByteArray_GET_SIZE(table) / (Py_ssize_t)sizeof(DedupSlot);
    Py_ssize_t cap = PyList_GET_SIZE(ring_keys);
    if (n < 2 || (n & (n - 1)) != 0 || n > ((Py_ssize_t)1 << 31) || cap * 2 > n
        || PyByteArray_GET_SIZE(table) != n * (Py_ssize_t)sizeof(DedupSlot)) {
        PyErr_SetString(PyExc_ValueError, "the dedup table must hold a power of two slots, at least twice the ring's");
        return -1;
    }
    *t = (DedupSlot *)PyByteArray_AS_STRING(table);
    *mask = (uint32_t)(n - 1);
    return 0;
}

static int dedup_tag(PyObject *key, uint32_t *tag) {
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1) return -1;
    *tag = (uint32_t)(uint64_t)h;
    return 0;
}

/* The table index of ``key``'s entry, -1 when it has none, -2 on an error. */
static Py_ssize_t dedup_probe(const DedupSlot *t, uint32_t mask, uint32_t tag, PyObject *key, PyObject *ring_keys) {
    Py_ssize_t cap = PyList_GET_SIZE(ring_keys);
    for (uint32_t i = tag & mask;; i = (i + 1) & mask) {
        DedupSlot s = t[i];
        if (s.slot == DEDUP_EMPTY) return -1;
        if (s.tag != tag || (Py_ssize_t)s.slot >= cap) continue;
        PyObject *held = PyList_GET_ITEM(ring_keys, s.slot);
        if (held == key) return i;
        if (held == Py_None) continue;
        Py_INCREF(held);
        int eq = PyObject_RichCompareBool(held, key, Py_EQ);
        Py_DECREF(held);
        if (eq < 0) return -2;
        if (eq) return i;
    }
}

static void dedup_delete(DedupSlot *t, uint32_t mask, uint32_t j) {
    t[j].slot = DEDUP_EMPTY;
    for (uint32_t k = (j + 1) & mask; t[k].slot != DEDUP_EMPTY; k = (k + 1) & mask) {
        uint32_t home = t[k].tag & mask;
        if (((k - home) & mask) >= ((k - j) & mask)) { /* its home is not in (j, k]: fill the gap */
            t[j] = t[k];
            t[k].slot = DEDUP_EMPTY;
            j = k;
        }
    }
}

PyDoc_STRVAR(dedup_find_doc,
"dedup_find(table, keys, ring_keys) -> list\n\n"
"For each of ``keys`` (str, or None: found nowhere) the ring slot holding its newest put, or\n"
"None. ``table``: the index's bytearray (module comment); ``ring_keys``: the window's key column.");

static PyObject *py_dedup_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dedup_find(table: bytearray, keys: list, ring_keys: list)");
        return NULL;
    }
    DedupSlot *t;
    uint32_t mask;
    PyObject *keys = args[1], *ring_keys = args[2];
    if (dedup_args(args[0], ring_keys, &t, &mask) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) { /* exact str keys only: no Python code runs in here */
        PyObject *key = PyList_GET_ITEM(keys, j);
        if (key != Py_None && !PyUnicode_CheckExact(key)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "dedup_find: every key must be a str or None");
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *key = PyList_GET_ITEM(keys, j), *found = Py_None;
        if (key != Py_None) {
            uint32_t tag;
            if (dedup_tag(key, &tag) < 0) goto fail;
            Py_ssize_t i = dedup_probe(t, mask, tag, key, ring_keys);
            if (i == -2) goto fail;
            if (i >= 0) {
                found = PyLong_FromUnsignedLong(t[i].slot);
                if (found == NULL) goto fail;
                PyList_SET_ITEM(out, j, found);
                continue;
            }
        }
        PyList_SET_ITEM(out, j, Py_NewRef(found));
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(dedup_put_doc,
"dedup_put(table, keys, start, ring_keys, ring_tags) -> int\n\n"
"Put ``keys`` (str, none None) into ring slots start, start + 1, ... (wrapping around the\n"
"ring): each slot's old key leaves the index unless its newest put is elsewhere, the new key\n"
"points at the slot (a key already indexed moves to it), and the slot's key (``ring_keys``) and\n"
"tag (``ring_tags``, a bytearray of 4 bytes a slot) are written. Returns the change in how\n"
"many keys the index holds.");

static PyObject *py_dedup_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[1]) || !PyByteArray_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "dedup_put(table: bytearray, keys: list, start: int, ring_keys: list, ring_tags: bytearray)");
        return NULL;
    }
    DedupSlot *t;
    uint32_t mask;
    PyObject *keys = args[1], *ring_keys = args[3], *tags_obj = args[4];
    if (dedup_args(args[0], ring_keys, &t, &mask) < 0) return NULL;
    Py_ssize_t cap = PyList_GET_SIZE(ring_keys), start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (cap <= 0 || start < 0 || start >= cap || PyByteArray_GET_SIZE(tags_obj) != cap * 4) {
        PyErr_SetString(PyExc_ValueError, "dedup_put: start outside the ring, or tags not 4 bytes a slot");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys), change = 0;
    /* Checked before anything changes, so a refused call leaves the index as it was; with exact
       str keys (and the ring's, which only this writes) no Python code runs below. */
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!PyUnicode_CheckExact(PyList_GET_ITEM(keys, j))) {
            PyErr_SetString(PyExc_TypeError, "dedup_put: every key must be a str");
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *key = PyList_GET_ITEM(keys, j);
        uint32_t tag;
        if (dedup_tag(key, &tag) < 0) return NULL;
        uint32_t r = (uint32_t)((start + j) % cap);
        uint32_t *tags = (uint32_t *)PyByteArray_AS_STRING(tags_obj);
        if (PyList_GET_ITEM(ring_keys, r) != Py_None) { /* the slot's old key, if its newest put is here */
            uint32_t old_tag = tags[r];
            for (uint32_t i = old_tag & mask; t[i].slot != DEDUP_EMPTY; i = (i + 1) & mask) {
                if (t[i].slot == r) {
                    dedup_delete(t, mask, i);
                    change--;
                    break;
                }
            }
        }
        Py_ssize_t i = dedup_probe(t, mask, tag, key, ring_keys);
        if (i == -2) return NULL;
        if (i >= 0) {
            t[i].slot = r;
        } else {
            uint32_t k = tag & mask;
            while (t[k].slot != DEDUP_EMPTY) k = (k + 1) & mask;
            t[k].tag = tag;
            t[k].slot = r;
            change++;
        }
        tags[r] = tag;
        if (PyList_SetItem(ring_keys, r, Py_NewRef(key)) < 0) return NULL; /* drops the old key */
    }
    return PyLong_FromSsize_t(change);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))py_configure, METH_FASTCALL, configure_doc},
    {"check_record", (PyCFunction)(void (*)(void))py_check_record, METH_FASTCALL, check_record_doc},
    {"adopt_run", (PyCFunction)(void (*)(void))py_adopt_run, METH_FASTCALL, adopt_run_doc},
    {"decode_record", (PyCFunction)(void (*)(void))py_decode_record, METH_FASTCALL, decode_record_doc},
    {"decode_records", (PyCFunction)(void (*)(void))py_decode_records, METH_FASTCALL, decode_records_doc},
    {"pull_many_results", (PyCFunction)(void (*)(void))py_pull_many_results, METH_FASTCALL, pull_many_results_doc},
    {"pull_result_records", (PyCFunction)(void (*)(void))py_pull_result_records, METH_FASTCALL,
     pull_result_records_doc},
    {"assign_offsets", (PyCFunction)(void (*)(void))py_assign_offsets, METH_FASTCALL, assign_offsets_doc},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL, encode_run_doc},
    {"configure_record", (PyCFunction)(void (*)(void))py_configure_record, METH_FASTCALL,
     configure_record_doc},
    {"use_crc32", (PyCFunction)(void (*)(void))py_use_crc32, METH_FASTCALL, use_crc32_doc},
    {"index_hashes", (PyCFunction)(void (*)(void))py_index_hashes, METH_FASTCALL, index_hashes_doc},
    {"message_ids", (PyCFunction)(void (*)(void))py_message_ids, METH_FASTCALL, message_ids_doc},
    {"encode_put_results", (PyCFunction)(void (*)(void))py_encode_put_results, METH_FASTCALL,
     encode_put_results_doc},
    {"index_put_run", (PyCFunction)(void (*)(void))py_index_put_run, METH_FASTCALL, index_put_run_doc},
    {"split_transient", (PyCFunction)(void (*)(void))py_split_transient, METH_FASTCALL, split_transient_doc},
    {"hold_entries", (PyCFunction)(void (*)(void))py_hold_entries, METH_FASTCALL, hold_entries_doc},
    {"frame_run", (PyCFunction)(void (*)(void))py_frame_run, METH_FASTCALL, frame_run_doc},
    {"framed_starts", (PyCFunction)(void (*)(void))py_framed_starts, METH_FASTCALL, framed_starts_doc},
    {"retag", (PyCFunction)(void (*)(void))py_retag, METH_FASTCALL, retag_doc},
    {"queue_runs", (PyCFunction)(void (*)(void))py_queue_runs, METH_FASTCALL, queue_runs_doc},
    {"index_entries", (PyCFunction)(void (*)(void))py_index_entries, METH_FASTCALL, index_entries_doc},
    {"scan_run", (PyCFunction)(void (*)(void))py_scan_run, METH_FASTCALL, scan_run_doc},
    {"record_cuts", (PyCFunction)(void (*)(void))py_record_cuts, METH_FASTCALL, record_cuts_doc},
    {"dedup_find", (PyCFunction)(void (*)(void))py_dedup_find, METH_FASTCALL, dedup_find_doc},
    {"dedup_put", (PyCFunction)(void (*)(void))py_dedup_put, METH_FASTCALL, dedup_put_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "libstore._codec",
    "The record codec's hot loops in C; libstore.record_codec is the reference.", -1, methods,
};

PyMODINIT_FUNC PyInit__codec(void) {
    S.topic_names = PyDict_New();
    S.empty_tuple = PyTuple_New(0);
    S.empty_str = PyUnicode_FromStringAndSize("", 0);
    S.space = PyUnicode_FromString(" ");
    PyObject *array_module = PyImport_ImportModule("array");
    if (array_module == NULL) return NULL;
    S.array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (S.array_type == NULL) return NULL;
    if ((S.typecode_q = PyUnicode_InternFromString("q")) == NULL
        || (S.n_toreadonly = PyUnicode_InternFromString("toreadonly")) == NULL)
        return NULL;
    if ((S.n_topic = PyUnicode_InternFromString("topic")) == NULL
        || (S.n_body = PyUnicode_InternFromString("body")) == NULL
        || (S.n_queue_id = PyUnicode_InternFromString("queue_id")) == NULL
        || (S.n_properties = PyUnicode_InternFromString("properties")) == NULL
        || (S.n_born_host = PyUnicode_InternFromString("born_host")) == NULL
        || (S.n_sys_flag = PyUnicode_InternFromString("sys_flag")) == NULL
        || (S.n_flag = PyUnicode_InternFromString("flag")) == NULL
        || (S.n_born_timestamp = PyUnicode_InternFromString("born_timestamp")) == NULL
        || (S.n_reconsume_times = PyUnicode_InternFromString("reconsume_times")) == NULL
        || (S.n_prepared_transaction_offset = PyUnicode_InternFromString("prepared_transaction_offset")) == NULL)
        return NULL;
    if (S.topic_names == NULL || S.empty_tuple == NULL || S.empty_str == NULL || S.space == NULL) return NULL;
    return PyModule_Create(&module);
}
