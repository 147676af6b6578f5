/* jsonschema.c — compiles the strict-structured-outputs subset of JSON Schema into grammar nodes,
 * runs the byte-level pushdown matcher over them (and finds the bytes it forces next), computes
 * token masks by walking a byte trie of the vocabulary with the matcher, and spells forced bytes
 * in that trie's tokens (see jsonschema.h for the subset and the rules). */
#include "jsonschema.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ================================================================ grammar */

enum { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_ENUM, K_ANYOF, K_ALIAS };
/* reserved nodes, present in every grammar */
enum { N_ANY = 0, N_STR = 1, N_NUM = 2, N_LIT = 3, N_RESERVED = 4 };

/* A sorted set of byte strings (keys as "\"name\"", enum values as compact JSON). */
typedef struct {
    int n;
    char **s;
    uint32_t *len;
    uint16_t *idx; /* sorted position -> original index (object keys: property number) */
} strset;

typedef struct {
    int kind;
    /* K_OBJECT */
    int n_props;
    uint32_t *prop_node; /* [n_props], schema order */
    uint64_t required;   /* bits of the required properties */
    strset keys;
    /* K_ARRAY */
    uint32_t items, min_items, max_items;
    /* K_ENUM */
    strset vals;
    /* K_ANYOF: alts; K_ALIAS: alts[0] is the target (resolved away after compiling) */
    int n_alts;
    uint32_t *alts;
} gnode;

struct zs_jschema {
    gnode *nodes;
    int n_nodes, cap_nodes;
    uint32_t root;
};

static void strset_free(strset *s) {
    for (int i = 0; i < s->n; i++) free(s->s[i]);
    free(s->s);
    free(s->len);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

void zs_jschema_free(zs_jschema *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = &g->nodes[i];
        free(n->prop_node);
        strset_free(&n->keys);
        strset_free(&n->vals);
        free(n->alts);
    }
    free(g->nodes);
    free(g);
}

static int new_node(zs_jschema *g, int kind, uint32_t *idx) {
    if (g->n_nodes >= 65535) return zs_err(ZS_EINVAL, "json schema: more than 65535 grammar nodes");
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        gnode *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    memset(&g->nodes[g->n_nodes], 0, sizeof(gnode));
    g->nodes[g->n_nodes].kind = kind;
    *idx = (uint32_t)g->n_nodes++;
    return 0;
}

/* ---- byte strings */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf_t;

static void bput(buf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Compact JSON of v: strings as jansson escapes them (UTF-8 kept), reals in the shortest form
 * that reads back exactly, object members in their order. */
static void ser(buf_t *b, const json_t *v) {
    char tmp[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        bput(b, "{", 1);
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) bput(b, ",", 1);
            first = 0;
            json_t *ks = json_string(k);
            ser(b, ks);
            json_decref(ks);
            bput(b, ":", 1);
            ser(b, x);
        }
        bput(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        bput(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) bput(b, ",", 1);
            ser(b, json_array_get(v, i));
        }
        bput(b, "]", 1);
        break;
    case JSON_STRING: {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!s) {
            b->oom = 1;
            return;
        }
        bput(b, s, strlen(s));
        free(s);
        break;
    }
    case JSON_INTEGER:
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        bput(b, tmp, strlen(tmp));
        break;
    case JSON_REAL: {
        double d = json_real_value(v);
        for (int p = 1; p <= 17; p++) {
            snprintf(tmp, sizeof tmp, "%.*g", p, d);
            if (strtod(tmp, NULL) == d) break;
        }
        bput(b, tmp, strlen(tmp));
        break;
    }
    case JSON_TRUE: bput(b, "true", 4); break;
    case JSON_FALSE: bput(b, "false", 5); break;
    default: bput(b, "null", 4); break;
    }
}

static int cmp_bytes(const char *a, size_t na, const char *b, size_t nb) {
    int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : (na < nb ? -1 : na > nb);
}

static const strset *sort_set; /* qsort has no context argument; compile is serialized below */
static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
static int cmp_idx(const void *pa, const void *pb) {
    int a = *(const uint16_t *)pa, b = *(const uint16_t *)pb;
    return cmp_bytes(sort_set->s[a], sort_set->len[a], sort_set->s[b], sort_set->len[b]);
}

/* Takes the strings (idx[i] = i), sorts them; the arrays are permuted so that s[k] is the k-th
 * smallest and idx[k] its original position. Duplicates are removed when dedup is set. */
static int strset_sort(strset *ss, int dedup) {
    uint16_t *order = malloc((size_t)(ss->n ? ss->n : 1) * sizeof *order);
    char **s = malloc((size_t)(ss->n ? ss->n : 1) * sizeof *s);
    uint32_t *len = malloc((size_t)(ss->n ? ss->n : 1) * sizeof *len);
    if (!order || !s || !len) {
        free(order);
        free(s);
        free(len);
        return zs_err(ZS_ENOMEM, "json schema: out of memory");
    }
    for (int i = 0; i < ss->n; i++) order[i] = (uint16_t)i;
    pthread_mutex_lock(&sort_lock);
    sort_set = ss;
    qsort(order, (size_t)ss->n, sizeof *order, cmp_idx);
    pthread_mutex_unlock(&sort_lock);
    int m = 0;
    for (int k = 0; k < ss->n; k++) {
        int i = order[k];
        if (dedup && m && !cmp_bytes(s[m - 1], len[m - 1], ss->s[i], ss->len[i])) {
            free(ss->s[i]);
            continue;
        }
        s[m] = ss->s[i];
        len[m] = ss->len[i];
        order[m] = ss->idx ? ss->idx[i] : (uint16_t)i;
        m++;
    }
    free(ss->s);
    free(ss->len);
    free(ss->idx);
    ss->s = s;
    ss->len = len;
    ss->idx = order;
    ss->n = m;
    return 0;
}

static int strset_add(strset *ss, const char *p, size_t n) {
    if (ss->n >= 65535) return zs_err(ZS_EINVAL, "json schema: too many values");
    char **s = realloc(ss->s, (size_t)(ss->n + 1) * sizeof *s);
    if (s) ss->s = s;
    uint32_t *len = realloc(ss->len, (size_t)(ss->n + 1) * sizeof *len);
    if (len) ss->len = len;
    char *c = malloc(n + 1);
    if (!s || !len || !c) {
        free(c);
        return zs_err(ZS_ENOMEM, "json schema: out of memory");
    }
    memcpy(c, p, n);
    c[n] = 0;
    ss->s[ss->n] = c;
    ss->len[ss->n] = (uint32_t)n;
    ss->n++;
    return 0;
}

/* ================================================================ compiler */

typedef struct {
    char *name;     /* "#", "#/$defs/x" */
    uint32_t alias; /* K_ALIAS node */
    json_t *target; /* borrowed */
    char *ptr;
    int done;
} ref_t;

typedef struct {
    zs_jschema *g;
    json_t *root;
    ref_t *refs;
    int n_refs;
} comp;

static int compile_node(comp *c, json_t *s, const char *ptr, uint32_t *out);

static const char *PTR(const char *p) { return *p ? p : "/"; }

static char *ptr_join(const char *ptr, const char *a, const char *b) {
    buf_t o = {0};
    bput(&o, ptr, strlen(ptr));
    bput(&o, "/", 1);
    for (const char *q = a; *q; q++) {
        if (*q == '~') bput(&o, "~0", 2);
        else if (*q == '/') bput(&o, "~1", 2);
        else bput(&o, q, 1);
    }
    if (b) {
        bput(&o, "/", 1);
        bput(&o, b, strlen(b));
    }
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

static int is_annotation(const char *k) {
    static const char *const ann[] = {"description", "title", "default", "examples", "$comment", "$schema",
                                      "$defs", "definitions", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return 1;
    return 0;
}

static int type_bit(const char *t) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}
enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64 };

static int value_has_type(const json_t *v, int types) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return types & T_OBJ;
    case JSON_ARRAY: return types & T_ARR;
    case JSON_STRING: return types & T_STR;
    case JSON_INTEGER: return types & (T_NUM | T_INT);
    case JSON_REAL: return types & T_NUM;
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOL;
    default: return types & T_NULL;
    }
}

static int compile_ref(comp *c, const char *ref, const char *ptr, uint32_t *out) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].name, ref)) {
            *out = c->refs[i].alias;
            return 0;
        }
    json_t *target = NULL;
    char *tptr = NULL;
    if (!strcmp(ref, "#")) {
        target = c->root;
        tptr = strdup("");
    } else {
        const char *name = NULL, *defs = NULL;
        if (!strncmp(ref, "#/$defs/", 8)) defs = "$defs", name = ref + 8;
        else if (!strncmp(ref, "#/definitions/", 14)) defs = "definitions", name = ref + 14;
        if (!name || !*name || strchr(name, '/'))
            return zs_err(ZS_EINVAL, "'$ref' at %s: \"%s\" is not supported (only \"#\", \"#/$defs/NAME\", "
                                     "\"#/definitions/NAME\")", PTR(ptr), ref);
        buf_t un = {0}; /* RFC 6901 unescape */
        for (const char *q = name; *q; q++) {
            if (q[0] == '~' && q[1] == '0') bput(&un, "~", 1), q++;
            else if (q[0] == '~' && q[1] == '1') bput(&un, "/", 1), q++;
            else bput(&un, q, 1);
        }
        if (un.oom) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        target = json_object_get(json_object_get(c->root, defs), un.p);
        free(un.p);
        if (!target) return zs_err(ZS_EINVAL, "'$ref' at %s: \"%s\" does not exist", PTR(ptr), ref);
        tptr = strdup(ref + 1);
    }
    ref_t *nr = realloc(c->refs, (size_t)(c->n_refs + 1) * sizeof *nr);
    char *nm = strdup(ref);
    if (!nr || !nm || !tptr) {
        if (nr) c->refs = nr;
        free(nm);
        free(tptr);
        return zs_err(ZS_ENOMEM, "json schema: out of memory");
    }
    c->refs = nr;
    ref_t *r = &c->refs[c->n_refs];
    memset(r, 0, sizeof *r);
    r->name = nm;
    r->target = target;
    r->ptr = tptr;
    int rc = new_node(c->g, K_ALIAS, &r->alias);
    if (rc < 0) {
        free(nm);
        free(tptr);
        return rc;
    }
    c->n_refs++;
    *out = r->alias;
    return 0;
}

static int make_enum(comp *c, json_t *vals, int types, const char *ptr, const char *kw, uint32_t *out) {
    uint32_t id;
    ZS_CHECK(new_node(c->g, K_ENUM, &id));
    for (size_t i = 0; i < json_array_size(vals); i++) {
        json_t *v = json_array_get(vals, i);
        if (types && !value_has_type(v, types)) continue;
        buf_t b = {0};
        ser(&b, v);
        if (b.oom) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        int rc = strset_add(&c->g->nodes[id].vals, b.p, b.n);
        free(b.p);
        ZS_CHECK(rc);
    }
    gnode *n = &c->g->nodes[id];
    if (!n->vals.n) return zs_err(ZS_EINVAL, "'%s' at %s has no value of the schema's type", kw, PTR(ptr));
    ZS_CHECK(strset_sort(&n->vals, 1));
    *out = id;
    return 0;
}

static int compile_object(comp *c, json_t *s, const char *ptr, uint32_t *out) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (!addl) return zs_err(ZS_EINVAL, "object at %s needs \"additionalProperties\": false", PTR(ptr));
    if (!json_is_false(addl))
        return zs_err(ZS_EINVAL, "'additionalProperties' at %s must be false (other values are not supported)",
                      PTR(ptr));
    if (props && !json_is_object(props)) return zs_err(ZS_EINVAL, "'properties' at %s must be an object", PTR(ptr));
    if (req && !json_is_array(req)) return zs_err(ZS_EINVAL, "'required' at %s must be an array", PTR(ptr));
    size_t np = props ? json_object_size(props) : 0;
    if (np > 64) return zs_err(ZS_EINVAL, "'properties' at %s: more than 64 properties are not supported", PTR(ptr));
    uint32_t id;
    ZS_CHECK(new_node(c->g, K_OBJECT, &id));
    {
        gnode *n = &c->g->nodes[id];
        n->prop_node = calloc(np ? np : 1, sizeof *n->prop_node);
        if (!n->prop_node) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        n->n_props = (int)np;
    }
    const char *k;
    json_t *v;
    int i = 0;
    if (props) json_object_foreach(props, k, v) {
        json_t *ks = json_string(k);
        buf_t b = {0};
        if (ks) ser(&b, ks);
        json_decref(ks);
        if (!ks || b.oom) {
            free(b.p);
            return zs_err(ZS_ENOMEM, "json schema: out of memory");
        }
        int rc = strset_add(&c->g->nodes[id].keys, b.p, b.n);
        free(b.p);
        ZS_CHECK(rc);
        char *p2 = ptr_join(ptr, "properties", NULL);
        char *p3 = p2 ? ptr_join(p2, k, NULL) : NULL;
        free(p2);
        if (!p3) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        uint32_t child;
        rc = compile_node(c, v, p3, &child);
        free(p3);
        ZS_CHECK(rc);
        c->g->nodes[id].prop_node[i++] = child; /* nodes may have moved: index again */
    }
    gnode *n = &c->g->nodes[id];
    for (size_t r = 0; r < json_array_size(req); r++) {
        const char *name = json_string_value(json_array_get(req, r));
        if (!name) return zs_err(ZS_EINVAL, "'required' at %s must hold strings", PTR(ptr));
        int found = -1, j = 0;
        if (props) json_object_foreach(props, k, v) {
            if (!strcmp(k, name)) found = j;
            j++;
        }
        if (found < 0)
            return zs_err(ZS_EINVAL, "'required' at %s names \"%s\", which is not in 'properties'", PTR(ptr), name);
        n->required |= 1ull << found;
    }
    ZS_CHECK(strset_sort(&n->keys, 0));
    *out = id;
    return 0;
}

static int get_count(json_t *v, const char *kw, const char *ptr, uint32_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0xffffffffLL)
        return zs_err(ZS_EINVAL, "'%s' at %s must be a non-negative integer", kw, PTR(ptr));
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int compile_array(comp *c, json_t *s, const char *ptr, uint32_t *out) {
    uint32_t id, items = N_ANY, mn = 0, mx = 0xffffffffu;
    json_t *it = json_object_get(s, "items"), *v;
    if ((v = json_object_get(s, "minItems"))) ZS_CHECK(get_count(v, "minItems", ptr, &mn));
    if ((v = json_object_get(s, "maxItems"))) ZS_CHECK(get_count(v, "maxItems", ptr, &mx));
    if (mn > mx) return zs_err(ZS_EINVAL, "'minItems' at %s is larger than 'maxItems'", PTR(ptr));
    if (it) {
        char *p2 = ptr_join(ptr, "items", NULL);
        if (!p2) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        int rc = compile_node(c, it, p2, &items);
        free(p2);
        ZS_CHECK(rc);
    }
    ZS_CHECK(new_node(c->g, K_ARRAY, &id));
    c->g->nodes[id].items = items;
    c->g->nodes[id].min_items = mn;
    c->g->nodes[id].max_items = mx;
    *out = id;
    return 0;
}

static int make_anyof(comp *c, const uint32_t *alts, int n, uint32_t *out) {
    if (n == 1) {
        *out = alts[0];
        return 0;
    }
    uint32_t id;
    ZS_CHECK(new_node(c->g, K_ANYOF, &id));
    gnode *g = &c->g->nodes[id];
    g->alts = malloc((size_t)n * sizeof *g->alts);
    if (!g->alts) return zs_err(ZS_ENOMEM, "json schema: out of memory");
    memcpy(g->alts, alts, (size_t)n * sizeof *alts);
    g->n_alts = n;
    *out = id;
    return 0;
}

static int compile_node(comp *c, json_t *s, const char *ptr, uint32_t *out) {
    if (!json_is_object(s)) return zs_err(ZS_EINVAL, "schema at %s must be an object", PTR(ptr));
    static const char *const obj_kw[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr_kw[] = {"items", "minItems", "maxItems", NULL};
    const char *k;
    json_t *v;
    int has_obj = 0, has_arr = 0;
    json_object_foreach(s, k, v) {
        if (is_annotation(k) || !strcmp(k, "type") || !strcmp(k, "enum") || !strcmp(k, "const") ||
            !strcmp(k, "anyOf") || !strcmp(k, "$ref"))
            continue;
        int known = 0;
        for (int i = 0; obj_kw[i]; i++)
            if (!strcmp(k, obj_kw[i])) known = has_obj = 1;
        for (int i = 0; arr_kw[i]; i++)
            if (!strcmp(k, arr_kw[i])) known = has_arr = 1;
        if (!known) return zs_err(ZS_EINVAL, "'%s' at %s is not supported", k, PTR(ptr));
    }
    json_t *type = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *any = json_object_get(s, "anyOf"), *ref = json_object_get(s, "$ref");
    const char *sole = ref ? "$ref" : any ? "anyOf" : NULL;
    if (sole) { /* only annotations beside $ref / anyOf */
        json_object_foreach(s, k, v) {
            if (!is_annotation(k) && strcmp(k, sole))
                return zs_err(ZS_EINVAL, "'%s' beside '%s' at %s is not supported", k, sole, PTR(ptr));
        }
    }
    if (ref) {
        if (!json_is_string(ref)) return zs_err(ZS_EINVAL, "'$ref' at %s must be a string", PTR(ptr));
        return compile_ref(c, json_string_value(ref), ptr, out);
    }
    if (any) {
        if (!json_is_array(any) || !json_array_size(any) || json_array_size(any) > 64)
            return zs_err(ZS_EINVAL, "'anyOf' at %s must be an array of 1 to 64 schemas", PTR(ptr));
        uint32_t alts[64];
        for (size_t i = 0; i < json_array_size(any); i++) {
            char num[24];
            snprintf(num, sizeof num, "%zu", i);
            char *p2 = ptr_join(ptr, "anyOf", num);
            if (!p2) return zs_err(ZS_ENOMEM, "json schema: out of memory");
            int rc = compile_node(c, json_array_get(any, i), p2, &alts[i]);
            free(p2);
            ZS_CHECK(rc);
        }
        return make_anyof(c, alts, (int)json_array_size(any), out);
    }
    int types = 0;
    if (type) {
        if (json_is_string(type)) {
            types = type_bit(json_string_value(type));
            if (!types)
                return zs_err(ZS_EINVAL, "'type' at %s: \"%s\" is not a JSON Schema type", PTR(ptr),
                              json_string_value(type));
        } else if (json_is_array(type) && json_array_size(type)) {
            for (size_t i = 0; i < json_array_size(type); i++) {
                const char *t = json_string_value(json_array_get(type, i));
                int b = t ? type_bit(t) : 0;
                if (!b) return zs_err(ZS_EINVAL, "'type' at %s: entry %zu is not a JSON Schema type", PTR(ptr), i);
                types |= b;
            }
        } else {
            return zs_err(ZS_EINVAL, "'type' at %s must be a string or a non-empty array of strings", PTR(ptr));
        }
    }
    if (en || cn) {
        if (en && cn) return zs_err(ZS_EINVAL, "'enum' beside 'const' at %s is not supported", PTR(ptr));
        if (has_obj || has_arr) {
            json_object_foreach(s, k, v) {
                if (!is_annotation(k) && strcmp(k, "type") && strcmp(k, en ? "enum" : "const"))
                    return zs_err(ZS_EINVAL, "'%s' beside '%s' at %s is not supported", k, en ? "enum" : "const",
                                  PTR(ptr));
            }
        }
        if (en && (!json_is_array(en) || !json_array_size(en)))
            return zs_err(ZS_EINVAL, "'enum' at %s must be a non-empty array", PTR(ptr));
        json_t *vals = en ? json_incref(en) : json_pack("[O]", cn);
        if (!vals) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        int rc = make_enum(c, vals, types, ptr, en ? "enum" : "const", out);
        json_decref(vals);
        return rc;
    }
    if (!types) return zs_err(ZS_EINVAL, "schema at %s has no 'type' (nor enum, const, anyOf, $ref)", PTR(ptr));
    if (has_obj && !(types & T_OBJ)) {
        json_object_foreach(s, k, v) {
            for (int i = 0; obj_kw[i]; i++)
                if (!strcmp(k, obj_kw[i])) return zs_err(ZS_EINVAL, "'%s' at %s needs type object", k, PTR(ptr));
        }
    }
    if (has_arr && !(types & T_ARR)) {
        json_object_foreach(s, k, v) {
            for (int i = 0; arr_kw[i]; i++)
                if (!strcmp(k, arr_kw[i])) return zs_err(ZS_EINVAL, "'%s' at %s needs type array", k, PTR(ptr));
        }
    }
    uint32_t alts[8];
    int n = 0;
    if (types & T_OBJ) ZS_CHECK(compile_object(c, s, ptr, &alts[n++]));
    if (types & T_ARR) ZS_CHECK(compile_array(c, s, ptr, &alts[n++]));
    if (types & T_STR) alts[n++] = N_STR;
    if (types & T_NUM) alts[n++] = N_NUM;
    else if (types & T_INT) ZS_CHECK(new_node(c->g, K_INTEGER, &alts[n++]));
    if (types & (T_BOOL | T_NULL)) {
        json_t *lits = json_array();
        if (types & T_BOOL) json_array_append_new(lits, json_true()), json_array_append_new(lits, json_false());
        if (types & T_NULL) json_array_append_new(lits, json_null());
        int rc = make_enum(c, lits, 0, ptr, "type", &alts[n++]);
        json_decref(lits);
        ZS_CHECK(rc);
    }
    return make_anyof(c, alts, n, out);
}

static int reserve_nodes(zs_jschema *g) {
    uint32_t id;
    ZS_CHECK(new_node(g, K_ANY, &id));
    ZS_CHECK(new_node(g, K_STRING, &id));
    ZS_CHECK(new_node(g, K_NUMBER, &id));
    ZS_CHECK(new_node(g, K_ENUM, &id));
    strset *ss = &g->nodes[N_LIT].vals;
    ZS_CHECK(strset_add(ss, "true", 4));
    ZS_CHECK(strset_add(ss, "false", 5));
    ZS_CHECK(strset_add(ss, "null", 4));
    return strset_sort(ss, 1);
}

/* Follows aliases to a real node; -1 on a cycle of aliases. */
static int64_t resolve(const zs_jschema *g, uint32_t i) {
    for (int steps = 0; steps <= g->n_nodes; steps++) {
        if (g->nodes[i].kind != K_ALIAS) return i;
        i = g->nodes[i].alts[0];
    }
    return -1;
}

static int compile_all(comp *c, const char *schema_json) {
    json_error_t e;
    c->root = json_loads(schema_json, JSON_REJECT_DUPLICATES, &e);
    if (!c->root) return zs_err(ZS_EINVAL, "json schema: not valid JSON (line %d: %s)", e.line, e.text);
    if (!json_is_object(c->root)) return zs_err(ZS_EINVAL, "json schema: the root must be an object schema");
    json_t *t = json_object_get(c->root, "type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "object"))
        return zs_err(ZS_EINVAL, "json schema: the root must have \"type\": \"object\"");
    ZS_CHECK(reserve_nodes(c->g));
    ZS_CHECK(compile_node(c, c->root, "", &c->g->root));
    for (int i = 0; i < c->n_refs; i++) { /* refs may add refs */
        uint32_t target;
        if (c->refs[i].target == c->root) target = c->g->root;
        else ZS_CHECK(compile_node(c, c->refs[i].target, c->refs[i].ptr, &target));
        gnode *a = &c->g->nodes[c->refs[i].alias];
        a->alts = malloc(sizeof *a->alts);
        if (!a->alts) return zs_err(ZS_ENOMEM, "json schema: out of memory");
        a->alts[0] = target;
        a->n_alts = 1;
    }
    zs_jschema *g = c->g;
    for (int i = 0; i < c->n_refs; i++)
        if (resolve(g, c->refs[i].alias) < 0)
            return zs_err(ZS_EINVAL, "'$ref' \"%s\" refers only to itself", c->refs[i].name);
    for (int i = 0; i < g->n_nodes; i++) { /* replace references to aliases by their targets */
        gnode *n = &g->nodes[i];
        for (int j = 0; j < n->n_props; j++) n->prop_node[j] = (uint32_t)resolve(g, n->prop_node[j]);
        if (n->kind == K_ARRAY) n->items = (uint32_t)resolve(g, n->items);
        if (n->kind == K_ANYOF)
            for (int j = 0; j < n->n_alts; j++) n->alts[j] = (uint32_t)resolve(g, n->alts[j]);
    }
    g->root = (uint32_t)resolve(g, g->root);
    return 0;
}

int zs_jschema_compile(const char *schema_json, zs_jschema **out) {
    if (!schema_json || !out) return zs_err(ZS_EINVAL, "zs_jschema_compile: NULL argument");
    comp c = {0};
    c.g = calloc(1, sizeof *c.g);
    if (!c.g) return zs_err(ZS_ENOMEM, "json schema: out of memory");
    int rc = compile_all(&c, schema_json);
    for (int i = 0; i < c.n_refs; i++) {
        free(c.refs[i].name);
        free(c.refs[i].ptr);
    }
    free(c.refs);
    json_decref(c.root);
    if (rc < 0) {
        zs_jschema_free(c.g);
        return rc;
    }
    *out = c.g;
    return 0;
}

int zs_jschema_any_object(zs_jschema **out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_jschema_any_object: NULL argument");
    zs_jschema *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "json schema: out of memory");
    int rc = reserve_nodes(g);
    uint32_t id = 0;
    if (rc == 0) rc = new_node(g, K_ANY, &id); /* the root: an ANY node that only takes '{' */
    if (rc < 0) {
        zs_jschema_free(g);
        return rc;
    }
    g->root = id;
    *out = g;
    return 0;
}

/* ================================================================ matcher */

enum {
    P_ROOT, P_DONE,
    O_START, O_COLON, O_VALUE, O_AFTER, O_NEXT, O_KEY,
    AO_START, AO_COLON, AO_VALUE, AO_AFTER, AO_NEXT,
    AA_START, AA_AFTER, AA_NEXT,
    A_START, A_AFTER, A_NEXT,
    S_CHAR, S_ESC, S_U,
    N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP,
    P_ENUM,
};

typedef zs_jschema_frame frame;
#define MAXD ZS_JSCHEMA_MAX_DEPTH

static void emit(zs_jschema_state *out, const frame *f, int d) {
    int off = 0;
    for (int i = 0; i < out->n_alt; i++) {
        if (out->depth[i] == d && !memcmp(&out->f[off], f, (size_t)d * sizeof *f)) return;
        off += out->depth[i];
    }
    if (out->n_alt >= ZS_JSCHEMA_MAX_ALTS || out->n_frames + d > ZS_JSCHEMA_MAX_FRAMES) return;
    memcpy(&out->f[out->n_frames], f, (size_t)d * sizeof *f);
    out->depth[out->n_alt++] = (uint8_t)d;
    out->n_frames = (uint16_t)(out->n_frames + d);
}

/* Narrows the sorted candidates [*lo, *hi) sharing pos bytes to those whose byte pos is c. */
static int narrow(const strset *ss, uint32_t *lo, uint32_t *hi, uint32_t pos, unsigned char c) {
    uint32_t a = *hi, b = *hi;
    for (uint32_t k = *lo; k < *hi; k++) {
        int hit = ss->len[k] > pos && (unsigned char)ss->s[k][pos] == c;
        if (hit && a == *hi) a = k;
        if (hit) b = k + 1;
        else if (a != *hi) break;
    }
    if (a == *hi) return 0;
    *lo = a;
    *hi = b;
    return 1;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* The first candidate of [lo,hi) is complete at pos: 1 = and self-delimiting (ends now),
 * 2 = a number (ends at the next byte that cannot extend it), 0 = not complete. */
static int enum_complete(const strset *ss, uint32_t lo, uint32_t pos) {
    if (ss->len[lo] != pos) return 0;
    return is_digit((unsigned char)ss->s[lo][pos - 1]) ? 2 : 1;
}

static void begin(const zs_jschema *g, frame *f, int d, uint32_t node, int c, zs_jschema_state *out, int rd);

/* Bits 0..p-1. */
static uint64_t below(int p) { return p >= 64 ? ~0ull : (1ull << p) - 1; }

/* The highest property seen (keys: bits of their property numbers), -1 for none. */
static int last_prop(uint64_t seen) { return seen ? 63 - __builtin_clzll(seen) : -1; }

/* Property p may be the next key after the keys seen: it comes later in the schema's order
 * and no required property lies between. */
static int key_may_follow(const gnode *n, uint64_t seen, int p) {
    int last = last_prop(seen);
    return p > last && !(n->required & below(p) & ~below(last + 1));
}

/* Whitespace in a gap between two tokens of a value, as llama.cpp's JSON grammar bounds it:
 * nothing, one space, or one newline and up to ZS_JSCHEMA_MAX_INDENT spaces/tabs. The frame's
 * ws: 0 = none yet, 1 = after the one space, 2 + k = after the newline and k indent bytes.
 * Returns 1 when c is whitespace (taken into t->ws, or refused: *ok = 0), 0 when it is not (the
 * gap ends, t->ws back to 0). */
static int gap_ws(frame *t, int c, int *ok) {
    *ok = 1;
    if (c == ' ' && t->ws == 0) t->ws = 1;
    else if (c == '\n' && t->ws == 0) t->ws = 2;
    else if ((c == ' ' || c == '\t') && t->ws >= 2 && t->ws < 2 + ZS_JSCHEMA_MAX_INDENT) t->ws++;
    else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') *ok = 0; /* a second run, \r, a lone tab */
    else {
        t->ws = 0;
        return 0;
    }
    return 1;
}

static void step(const zs_jschema *g, frame *f, int d, int c, zs_jschema_state *out) {
    frame *t = &f[d - 1];
    const gnode *n = &g->nodes[t->node];
    frame nf = {0};
    switch (t->phase) { /* the gaps inside a value (none before the root value or after it) */
    case O_START: case O_COLON: case O_VALUE: case O_AFTER: case O_NEXT:
    case AO_START: case AO_COLON: case AO_VALUE: case AO_AFTER: case AO_NEXT:
    case AA_START: case AA_AFTER: case AA_NEXT:
    case A_START: case A_AFTER: case A_NEXT: {
        int ok;
        if (gap_ws(t, c, &ok)) {
            if (ok) emit(out, f, d);
            return;
        }
        break;
    }
    default: break;
    }
    switch (t->phase) {
    case P_ROOT:
        t->phase = P_DONE;
        begin(g, f, d, g->root, c, out, 0);
        return;
    case P_DONE: return;
    case O_START:
    case O_NEXT:
        if (c == '"' && last_prop(t->b) + 1 < n->n_props && d < MAXD) {
            nf.node = t->node;
            nf.phase = O_KEY;
            nf.a = 1;
            nf.b = (uint64_t)n->keys.n << 32;
            f[d] = nf;
            emit(out, f, d + 1);
        } else if (c == '}' && t->phase == O_START && !n->required) {
            emit(out, f, d - 1);
        }
        return;
    case O_KEY: {
        frame *o = &f[d - 2];
        uint32_t lo = (uint32_t)t->b, hi = (uint32_t)(t->b >> 32), pos = t->a;
        if (!narrow(&n->keys, &lo, &hi, pos, (unsigned char)c)) return;
        int live = 0;
        for (uint32_t k = lo; k < hi && !live; k++) live = key_may_follow(n, o->b, n->keys.idx[k]);
        if (!live) return;
        pos++;
        if (enum_complete(&n->keys, lo, pos)) {
            o->a = n->keys.idx[lo];
            o->b |= 1ull << o->a;
            o->phase = O_COLON;
            emit(out, f, d - 1);
            return;
        }
        t->a = pos;
        t->b = lo | (uint64_t)hi << 32;
        emit(out, f, d);
        return;
    }
    case O_COLON:
        if (c == ':') t->phase = O_VALUE, emit(out, f, d);
        return;
    case O_VALUE:
        t->phase = O_AFTER;
        begin(g, f, d, n->prop_node[t->a], c, out, 0);
        return;
    case O_AFTER:
        if (c == ',' && last_prop(t->b) + 1 < n->n_props) t->phase = O_NEXT, emit(out, f, d);
        else if (c == '}' && !(n->required & ~below(last_prop(t->b) + 1))) emit(out, f, d - 1);
        return;
    case AO_START:
    case AO_NEXT:
        if (c == '"' && d < MAXD) {
            t->phase = AO_COLON;
            nf.node = N_STR;
            nf.phase = S_CHAR;
            f[d] = nf;
            emit(out, f, d + 1);
        } else if (c == '}' && t->phase == AO_START) {
            emit(out, f, d - 1);
        }
        return;
    case AO_COLON:
        if (c == ':') t->phase = AO_VALUE, emit(out, f, d);
        return;
    case AO_VALUE:
        t->phase = AO_AFTER;
        begin(g, f, d, N_ANY, c, out, 0);
        return;
    case AO_AFTER:
        if (c == ',') t->phase = AO_NEXT, emit(out, f, d);
        else if (c == '}') emit(out, f, d - 1);
        return;
    case AA_START:
        if (c == ']') {
            emit(out, f, d - 1);
            return;
        }
        /* fall through */
    case AA_NEXT:
        t->phase = AA_AFTER;
        begin(g, f, d, N_ANY, c, out, 0);
        return;
    case AA_AFTER:
        if (c == ',') t->phase = AA_NEXT, emit(out, f, d);
        else if (c == ']') emit(out, f, d - 1);
        return;
    case A_START:
        if (c == ']') {
            if (!n->min_items) emit(out, f, d - 1);
            return;
        }
        if (!n->max_items) return;
        /* fall through */
    case A_NEXT:
        t->a++;
        t->phase = A_AFTER;
        begin(g, f, d, n->items, c, out, 0);
        return;
    case A_AFTER:
        if (c == ',' && t->a < n->max_items) t->phase = A_NEXT, emit(out, f, d);
        else if (c == ']' && t->a >= n->min_items) emit(out, f, d - 1);
        return;
    case S_CHAR: {
        uint32_t rem = t->a & 0xff;
        if (rem) {
            if (c < (int)(t->a >> 8 & 0xff) || c > (int)(t->a >> 16 & 0xff)) return;
            rem--;
            t->a = rem ? (rem | 0x80u << 8 | 0xBFu << 16) : 0;
            emit(out, f, d);
            return;
        }
        if (c == '"') emit(out, f, d - 1);
        else if (c == '\\') t->phase = S_ESC, emit(out, f, d);
        else if (c < 0x20) return;
        else if (c < 0x80) emit(out, f, d);
        else {
            uint32_t r = 0, lo = 0x80, hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) r = 1;
            else if (c == 0xE0) r = 2, lo = 0xA0;
            else if (c == 0xED) r = 2, hi = 0x9F;
            else if (c >= 0xE1 && c <= 0xEF) r = 2;
            else if (c == 0xF0) r = 3, lo = 0x90;
            else if (c == 0xF4) r = 3, hi = 0x8F;
            else if (c >= 0xF1 && c <= 0xF3) r = 3;
            else return;
            t->a = r | lo << 8 | hi << 16;
            emit(out, f, d);
        }
        return;
    }
    case S_ESC:
        if (c == 'u') t->phase = S_U, t->a = 0, emit(out, f, d);
        else if (c && strchr("\"\\/bfnrt", c)) t->phase = S_CHAR, emit(out, f, d);
        return;
    case S_U:
        if (is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) {
            if (++t->a == 4) t->phase = S_CHAR, t->a = 0;
            emit(out, f, d);
        }
        return;
    case N_MINUS:
        if (c == '0') t->phase = N_ZERO, t->a = 1, emit(out, f, d);
        else if (is_digit(c)) t->phase = N_INT, t->a = 1, emit(out, f, d);
        return;
    case N_ZERO:
    case N_INT:
        if (is_digit(c) && t->phase == N_INT) {
            if (t->a < ZS_JSCHEMA_MAX_INT_DIGITS) t->a++, emit(out, f, d);
        } else if (c == '.' && n->kind == K_NUMBER) t->phase = N_DOT, t->a = 0, emit(out, f, d);
        else if ((c == 'e' || c == 'E') && n->kind == K_NUMBER) t->phase = N_E, t->a = 0, emit(out, f, d);
        else if (!is_digit(c)) step(g, f, d - 1, c, out); /* the number ended: the byte is the parent's */
        return;
    case N_DOT:
        if (is_digit(c)) t->phase = N_FRAC, t->a = 1, emit(out, f, d);
        return;
    case N_FRAC:
        if (is_digit(c)) {
            if (t->a < ZS_JSCHEMA_MAX_FRAC_DIGITS) t->a++, emit(out, f, d);
        } else if (c == 'e' || c == 'E') t->phase = N_E, t->a = 0, emit(out, f, d);
        else step(g, f, d - 1, c, out);
        return;
    case N_E:
        if (c == '+' || c == '-') t->phase = N_ESIGN, emit(out, f, d);
        else if (is_digit(c)) t->phase = N_EXP, t->a = 1, emit(out, f, d);
        return;
    case N_ESIGN:
        if (is_digit(c)) t->phase = N_EXP, t->a = 1, emit(out, f, d);
        return;
    case N_EXP:
        if (is_digit(c)) {
            if (t->a < ZS_JSCHEMA_MAX_EXP_DIGITS) t->a++, emit(out, f, d);
        } else step(g, f, d - 1, c, out);
        return;
    case P_ENUM: {
        uint32_t lo = (uint32_t)t->b, hi = (uint32_t)(t->b >> 32), pos = t->a;
        if (!narrow(&n->vals, &lo, &hi, pos, (unsigned char)c)) {
            if (enum_complete(&n->vals, lo, pos) == 2) step(g, f, d - 1, c, out);
            return;
        }
        pos++;
        if (enum_complete(&n->vals, lo, pos) == 1) {
            emit(out, f, d - 1);
            return;
        }
        t->a = pos;
        t->b = lo | (uint64_t)hi << 32;
        emit(out, f, d);
        return;
    }
    default: return;
    }
}

/* A value of node starts with byte c; f[0..d) is the stack below it (its phase already set to
 * what follows the value). rd bounds anyOf nesting (a schema could nest anyOf in itself). */
static void begin(const zs_jschema *g, frame *f, int d, uint32_t node, int c, zs_jschema_state *out, int rd) {
    const gnode *n = &g->nodes[node];
    frame nf = {0};
    nf.node = (uint16_t)node;
    switch (n->kind) {
    case K_ANY:
        if (c == '{') nf.phase = AO_START;
        else if (c == '[' && node == N_ANY) nf.phase = AA_START;
        else if (node != N_ANY) return; /* the json_object root: objects only */
        else if (c == '"') nf.node = N_STR, nf.phase = S_CHAR;
        else if (c == '-' || is_digit(c)) {
            begin(g, f, d, N_NUM, c, out, rd);
            return;
        } else if (c == 't' || c == 'f' || c == 'n') {
            begin(g, f, d, N_LIT, c, out, rd);
            return;
        } else return;
        break;
    case K_OBJECT:
        if (c != '{') return;
        nf.phase = O_START;
        break;
    case K_ARRAY:
        if (c != '[') return;
        nf.phase = A_START;
        break;
    case K_STRING:
        if (c != '"') return;
        nf.phase = S_CHAR;
        break;
    case K_NUMBER:
    case K_INTEGER:
        if (c == '-') nf.phase = N_MINUS;
        else if (c == '0') nf.phase = N_ZERO, nf.a = 1;
        else if (is_digit(c)) nf.phase = N_INT, nf.a = 1;
        else return;
        break;
    case K_ENUM: {
        uint32_t lo = 0, hi = (uint32_t)n->vals.n;
        if (!narrow(&n->vals, &lo, &hi, 0, (unsigned char)c)) return;
        if (enum_complete(&n->vals, lo, 1) == 1) {
            emit(out, f, d);
            return;
        }
        nf.phase = P_ENUM;
        nf.a = 1;
        nf.b = lo | (uint64_t)hi << 32;
        break;
    }
    case K_ANYOF:
        if (rd > 16) return;
        for (int i = 0; i < n->n_alts; i++) {
            frame copy[MAXD];
            memcpy(copy, f, (size_t)d * sizeof *f);
            begin(g, copy, d, n->alts[i], c, out, rd + 1);
        }
        return;
    default: return;
    }
    if (d >= MAXD) return;
    f[d] = nf;
    emit(out, f, d + 1);
}

void zs_jschema_state_init(const zs_jschema *g, zs_jschema_state *st) {
    (void)g;
    st->n_alt = 1;
    st->n_frames = 1;
    st->depth[0] = 1;
    memset(&st->f[0], 0, sizeof st->f[0]);
    st->f[0].phase = P_ROOT;
}

void zs_jschema_state_copy(zs_jschema_state *dst, const zs_jschema_state *src) {
    dst->n_alt = src->n_alt;
    dst->n_frames = src->n_frames;
    memcpy(dst->depth, src->depth, src->n_alt);
    memcpy(dst->f, src->f, (size_t)src->n_frames * sizeof src->f[0]);
}

static int feed1(const zs_jschema *g, const zs_jschema_state *in, int c, zs_jschema_state *out) {
    out->n_alt = 0;
    out->n_frames = 0;
    int off = 0;
    for (int i = 0; i < in->n_alt; i++) {
        frame f[MAXD];
        int d = in->depth[i];
        memcpy(f, &in->f[off], (size_t)d * sizeof *f);
        off += d;
        step(g, f, d, c, out);
    }
    return out->n_alt > 0;
}

int zs_jschema_feed(const zs_jschema *g, zs_jschema_state *st, const char *bytes, size_t n) {
    if (!g || !st || (!bytes && n)) return 0;
    if (!n) return 1;
    zs_jschema_state *a = malloc(2 * sizeof *a);
    if (!a) return 0;
    const zs_jschema_state *cur = st;
    for (size_t i = 0; i < n; i++) {
        zs_jschema_state *nx = &a[i & 1];
        if (!feed1(g, cur, (unsigned char)bytes[i], nx)) {
            free(a);
            return 0;
        }
        cur = nx;
    }
    zs_jschema_state_copy(st, cur);
    free(a);
    return 1;
}

int zs_jschema_done(const zs_jschema *g, const zs_jschema_state *st) {
    if (!g || !st) return 0;
    int off = 0;
    for (int i = 0; i < st->n_alt; i++) {
        const frame *f = &st->f[off];
        int d = st->depth[i];
        off += d;
        while (d > 1) { /* a number at the end is complete when it could end here */
            const frame *t = &f[d - 1];
            int p = t->phase;
            if (p == N_ZERO || p == N_INT || p == N_FRAC || p == N_EXP) d--;
            else if (p == P_ENUM && enum_complete(&g->nodes[t->node].vals, (uint32_t)t->b, t->a) == 2) d--;
            else break;
        }
        if (d == 1 && f[0].phase == P_DONE) return 1;
    }
    return 0;
}

size_t zs_jschema_forced(const zs_jschema *g, const zs_jschema_state *st, char *out, size_t cap, int *done) {
    if (done) *done = 0;
    if (!g || !st || !out) return 0;
    zs_jschema_state *a = malloc(3 * sizeof *a); /* the state, a trial, the one byte's successor */
    if (!a) return 0;
    zs_jschema_state *cur = &a[0], *trial = &a[1], *next = &a[2];
    zs_jschema_state_copy(cur, st);
    size_t n = 0;
    int fin = zs_jschema_done(g, cur);
    while (n < cap && !fin) {
        int only = -1;
        for (int c = 0; c < 256 && only != -2; c++) {
            if (!feed1(g, cur, c, trial)) continue;
            if (only >= 0) only = -2; /* a second byte: a choice */
            else {
                only = c;
                zs_jschema_state *t = next;
                next = trial;
                trial = t;
            }
        }
        if (only < 0) break;
        out[n++] = (char)only;
        zs_jschema_state *t = cur;
        cur = next;
        next = t;
        fin = zs_jschema_done(g, cur);
    }
    if (done) *done = fin;
    free(a);
    return n;
}

/* ================================================================ token masks */

typedef struct {
    int32_t child, next; /* first child, next sibling (-1: none) */
    int32_t tok0, ntok;  /* ids ending here: ids[tok0 .. tok0+ntok) */
    uint8_t byte;
} tnode;

typedef struct {
    tnode *n;
    int32_t nn, cap;
    int32_t *ids;
    int32_t root_child[256];
} trie;

#define CACHE_N 64
typedef struct {
    uint64_t hash;
    size_t klen;
    unsigned char *key;
    uint32_t *bits;
    int count;
} centry;

struct zs_jschema_masks {
    const zs_jschema *g;
    const zs_tokenizer *tok;
    int n_vocab;
    size_t words;
    int max_len;
    trie all, special; /* special: tokens that are not plain string content */
    uint32_t *plain;   /* bits of tokens that leave an in-string state unchanged */
    int n_plain;
    int32_t *eos;
    int n_eos;
    pthread_mutex_t lock;
    centry cache[CACHE_N];
    int cache_next;
};

static int trie_add(trie *t, const unsigned char *s, size_t n, int32_t *end) {
    int32_t cur = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t *link = cur < 0 ? &t->root_child[s[i]] : &t->n[cur].child;
        int32_t c = *link;
        if (cur >= 0)
            while (c >= 0 && t->n[c].byte != s[i]) c = t->n[c].next;
        if (c < 0) {
            if (t->nn == t->cap) {
                int32_t cap = t->cap ? t->cap * 2 : 1024;
                tnode *nn = realloc(t->n, (size_t)cap * sizeof *nn);
                if (!nn) return zs_err(ZS_ENOMEM, "json schema mask: out of memory");
                t->n = nn;
                t->cap = cap;
                link = cur < 0 ? &t->root_child[s[i]] : &t->n[cur].child; /* t->n moved */
            }
            c = t->nn++;
            t->n[c] = (tnode){.child = -1, .next = cur < 0 ? -1 : *link, .tok0 = 0, .ntok = 0, .byte = s[i]};
            *link = c;
        }
        cur = c;
    }
    *end = cur;
    return 0;
}

/* Builds t over the ids with keep[id] set. */
static int trie_build(trie *t, const zs_tokenizer *tok, const uint8_t *keep, int n_vocab) {
    memset(t, 0, sizeof *t);
    for (int b = 0; b < 256; b++) t->root_child[b] = -1;
    int32_t *end = malloc((size_t)n_vocab * sizeof *end);
    t->ids = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *t->ids);
    if (!end || !t->ids) {
        free(end);
        return zs_err(ZS_ENOMEM, "json schema mask: out of memory");
    }
    for (int id = 0; id < n_vocab; id++) {
        end[id] = -1;
        if (!keep[id]) continue;
        size_t len;
        const char *s = zs_tokenizer_token_bytes(tok, id, &len);
        int rc = trie_add(t, (const unsigned char *)s, len, &end[id]);
        if (rc < 0) {
            free(end);
            return rc;
        }
    }
    for (int id = 0; id < n_vocab; id++)
        if (end[id] >= 0) t->n[end[id]].ntok++;
    int32_t pos = 0;
    for (int32_t i = 0; i < t->nn; i++) t->n[i].tok0 = pos, pos += t->n[i].ntok, t->n[i].ntok = 0;
    for (int pass = 0; pass < 2; pass++) /* at each node: pieces first, then byte-fallback tokens */
        for (int id = 0; id < n_vocab; id++)
            if (end[id] >= 0 && zs_tokenizer_is_byte_fallback(tok, id) == pass)
                t->ids[t->n[end[id]].tok0 + t->n[end[id]].ntok++] = id;
    free(end);
    return 0;
}

void zs_jschema_mask_free(zs_jschema_masks *m) {
    if (!m) return;
    free(m->all.n);
    free(m->all.ids);
    free(m->special.n);
    free(m->special.ids);
    free(m->plain);
    free(m->eos);
    for (int i = 0; i < CACHE_N; i++) {
        free(m->cache[i].key);
        free(m->cache[i].bits);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* 1 when s[0..n) is complete UTF-8 with no '"', '\\' or control byte. */
static int plain_string_bytes(const unsigned char *s, size_t n) {
    if (!n) return 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\') return 0;
            i++;
            continue;
        }
        int r;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) r = 1;
        else if (c == 0xE0) r = 2, lo = 0xA0;
        else if (c == 0xED) r = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) r = 2;
        else if (c == 0xF0) r = 3, lo = 0x90;
        else if (c == 0xF4) r = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) r = 3;
        else return 0;
        if (i + (size_t)r >= n) return 0; /* incomplete sequence */
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= r; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += (size_t)r + 1;
    }
    return 1;
}

int zs_jschema_mask_new(const zs_jschema *g, const zs_tokenizer *tok, zs_jschema_masks **out) {
    if (!g || !tok || !out) return zs_err(ZS_EINVAL, "zs_jschema_mask_new: NULL argument");
    zs_jschema_masks *m = calloc(1, sizeof *m);
    if (!m) return zs_err(ZS_ENOMEM, "json schema mask: out of memory");
    pthread_mutex_init(&m->lock, NULL);
    m->g = g;
    m->tok = tok;
    m->n_vocab = zs_tokenizer_vocab_size(tok);
    m->words = ((size_t)m->n_vocab + 31) / 32;
    uint8_t *keep = calloc((size_t)m->n_vocab + 1, 2);
    m->plain = calloc(m->words ? m->words : 1, sizeof *m->plain);
    m->eos = malloc((size_t)(m->n_vocab ? m->n_vocab : 1) * sizeof *m->eos);
    int rc = keep && m->plain && m->eos ? 0 : zs_err(ZS_ENOMEM, "json schema mask: out of memory");
    uint8_t *keep2 = keep ? keep + m->n_vocab + 1 : NULL;
    for (int id = 0; id < m->n_vocab && rc == 0; id++) {
        if (zs_tokenizer_is_eos(tok, id)) m->eos[m->n_eos++] = id;
        if (zs_tokenizer_is_special(tok, id)) continue;
        size_t len;
        const unsigned char *s = (const unsigned char *)zs_tokenizer_token_bytes(tok, id, &len);
        if (!s || !len) continue;
        if ((int)len > m->max_len) m->max_len = (int)len;
        keep[id] = 1;
        if (plain_string_bytes(s, len)) {
            m->plain[id / 32] |= 1u << (id % 32);
            m->n_plain++;
        } else {
            keep2[id] = 1;
        }
    }
    if (rc == 0) rc = trie_build(&m->all, tok, keep, m->n_vocab);
    if (rc == 0) rc = trie_build(&m->special, tok, keep2, m->n_vocab);
    free(keep);
    if (rc < 0) {
        zs_jschema_mask_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

size_t zs_jschema_mask_words(const zs_jschema_masks *m) { return m ? m->words : 0; }

static int walk(const zs_jschema_masks *m, const trie *t, int32_t first, zs_jschema_state *st, int depth,
                uint32_t *bits) {
    int count = 0;
    for (int32_t c = first; c >= 0; c = t->n[c].next) {
        if (!feed1(m->g, &st[depth], t->n[c].byte, &st[depth + 1])) continue;
        for (int32_t k = 0; k < t->n[c].ntok; k++) {
            int32_t id = t->ids[t->n[c].tok0 + k];
            if (!(bits[id / 32] >> (id % 32) & 1)) count++;
            bits[id / 32] |= 1u << (id % 32);
        }
        if (t->n[c].child >= 0) count += walk(m, t, t->n[c].child, st, depth + 1, bits);
    }
    return count;
}

static int walk_root(const zs_jschema_masks *m, const trie *t, zs_jschema_state *st, uint32_t *bits) {
    int count = 0;
    for (int b = 0; b < 256; b++) {
        int32_t c = t->root_child[b];
        if (c < 0) continue;
        if (!feed1(m->g, &st[0], b, &st[1])) continue;
        for (int32_t k = 0; k < t->n[c].ntok; k++) {
            int32_t id = t->ids[t->n[c].tok0 + k];
            if (!(bits[id / 32] >> (id % 32) & 1)) count++;
            bits[id / 32] |= 1u << (id % 32);
        }
        if (t->n[c].child >= 0) count += walk(m, t, t->n[c].child, st, 1, bits);
    }
    return count;
}

int zs_jschema_mask_spell(const zs_jschema_masks *m, const char *bytes, size_t n, int32_t *ids, int k, size_t *used) {
    size_t at = 0;
    int count = 0;
    if (m && (bytes || !n) && (ids || k <= 0)) {
        const trie *t = &m->all;
        const unsigned char *b = (const unsigned char *)bytes;
        while (at < n && count < k) {
            int32_t best = -1, c = t->root_child[b[at]];
            size_t len = 0, best_len = 0;
            while (c >= 0) { /* down the trie along bytes[at..], the deepest node where a token ends */
                len++;
                if (t->n[c].ntok > 0) best = c, best_len = len;
                if (at + len >= n) break;
                int32_t ch = t->n[c].child;
                while (ch >= 0 && t->n[ch].byte != b[at + len]) ch = t->n[ch].next;
                c = ch;
            }
            if (best < 0) break;
            ids[count++] = t->ids[t->n[best].tok0]; /* the node's first: a piece, lowest id first */
            at += best_len;
        }
    }
    if (used) *used = at;
    return count;
}

static size_t state_key(const zs_jschema_state *st, unsigned char *key) {
    size_t n = 0;
    memcpy(key + n, &st->n_alt, sizeof st->n_alt), n += sizeof st->n_alt;
    memcpy(key + n, st->depth, st->n_alt), n += st->n_alt;
    memcpy(key + n, st->f, (size_t)st->n_frames * sizeof st->f[0]), n += (size_t)st->n_frames * sizeof st->f[0];
    return n;
}

int zs_jschema_mask(const zs_jschema_masks *mc, const zs_jschema_state *st, uint32_t *bits) {
    if (!mc || !st || !bits) return zs_err(ZS_EINVAL, "zs_jschema_mask: NULL argument");
    zs_jschema_masks *m = (zs_jschema_masks *)mc; /* only the cache changes, under the lock */
    unsigned char key[sizeof(zs_jschema_state)];
    size_t klen = state_key(st, key);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < klen; i++) h = (h ^ key[i]) * 1099511628211ull;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < CACHE_N; i++) {
        centry *e = &m->cache[i];
        if (e->key && e->hash == h && e->klen == klen && !memcmp(e->key, key, klen)) {
            memcpy(bits, e->bits, m->words * sizeof *bits);
            int count = e->count;
            pthread_mutex_unlock(&m->lock);
            return count;
        }
    }
    pthread_mutex_unlock(&m->lock);

    memset(bits, 0, m->words * sizeof *bits);
    zs_jschema_state *stk = malloc((size_t)(m->max_len + 2) * sizeof *stk);
    if (!stk) return zs_err(ZS_ENOMEM, "json schema mask: out of memory");
    zs_jschema_state_copy(&stk[0], st);
    int count = 0;
    const zs_jschema_frame *top = st->n_alt == 1 ? &st->f[st->n_frames - 1] : NULL;
    if (top && top->phase == S_CHAR && top->a == 0) { /* inside a string: plain tokens stay there */
        memcpy(bits, m->plain, m->words * sizeof *bits);
        count = m->n_plain + walk_root(m, &m->special, stk, bits);
    } else {
        count = walk_root(m, &m->all, stk, bits);
    }
    free(stk);
    if (zs_jschema_done(m->g, st))
        for (int i = 0; i < m->n_eos; i++) {
            int32_t id = m->eos[i];
            if (!(bits[id / 32] >> (id % 32) & 1)) count++;
            bits[id / 32] |= 1u << (id % 32);
        }

    pthread_mutex_lock(&m->lock);
    centry *e = &m->cache[m->cache_next];
    unsigned char *nk = malloc(klen);
    uint32_t *nb = e->bits ? e->bits : malloc(m->words * sizeof *nb);
    if (nk && nb) {
        free(e->key);
        memcpy(nk, key, klen);
        memcpy(nb, bits, m->words * sizeof *nb);
        *e = (centry){.hash = h, .klen = klen, .key = nk, .bits = nb, .count = count};
        m->cache_next = (m->cache_next + 1) % CACHE_N;
    } else {
        free(nk);
        if (!e->bits) free(nb);
    }
    pthread_mutex_unlock(&m->lock);
    return count;
}
