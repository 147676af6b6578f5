/* jsonschema.h — JSON-Schema grammars for structured outputs: compiles the subset of JSON Schema
 * that OpenAI's strict structured outputs accept (or "any JSON object", response_format
 * json_object) into a byte-level pushdown matcher, and computes per-step token masks over a
 * tokenizer's vocabulary (which tokens the matcher accepts next; EOS exactly when the value is
 * complete).
 *
 * Supported: type object (properties, required, additionalProperties: false — mandatory),
 * array (items, minItems, maxItems), string, number, integer, boolean, null, type lists
 * (["string","null"]), enum / const at any level (matched against the compact serialization of
 * each value), anyOf, $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed);
 * description, title, default, examples, $comment, $schema are annotations and ignored.
 * Anything else -> ZS_EINVAL naming the keyword and its JSON pointer, e.g.
 * "'pattern' at /properties/name is not supported". The root must be an object schema.
 *
 * Matching rules: an object's keys come in the order of its schema's "properties", as OpenAI's
 * structured outputs write them (each at most once; optional ones may be left out, required ones
 * may not); keys and enum values are compared byte for byte with their compact
 * JSON serialization (an escaped spelling such as "\u0061" for "a" is rejected); integer means
 * no '.'/exponent; whitespace outside strings is bounded as in llama.cpp's JSON grammar: in each
 * gap between two tokens of the value (after '{', '[', ',', ':', a key, a value) either nothing,
 * one space, or one newline followed by at most ZS_JSCHEMA_MAX_INDENT spaces/tabs (llama.cpp: 20); none before
 * the root value or after it, no '\r', no second run (so "\n\n" or "  :" cannot be written and a
 * model cannot spend its tokens on layout, while the compact form and a pretty-printed one both
 * stay on the table: a model that writes JSON pretty-printed is not pushed off its
 * distribution); numbers have at most the ZS_JSCHEMA_MAX_*_DIGITS digits per part (so neither
 * whitespace nor digits can loop forever and every number parses as int64/finite double);
 * nesting depth is capped at ZS_JSCHEMA_MAX_DEPTH. Strings must be valid UTF-8 without raw control
 * characters. "Any JSON object" (zs_jschema_any_object) takes keys in any order, duplicates
 * included, as JSON does.
 *
 * Ownership: zs_jschema_compile / zs_jschema_any_object return a grammar freed with
 * zs_jschema_free; zs_jschema_mask_new returns mask tables freed with zs_jschema_mask_free,
 * which borrow the grammar and the tokenizer (both must outlive them). A zs_jschema_state is a
 * plain value owned by whoever holds it (no pointers inside): copy it with
 * zs_jschema_state_copy (copies only the used part) or plain struct assignment.
 *
 * Thread-safety: a compiled grammar and mask tables are read-only after creation and may be
 * used from many threads at once (the mask's small per-state cache is guarded by a mutex);
 * a state belongs to one request / one thread at a time.
 *
 * Errors: functions returning int give 0 or a negative ZS_E* code with a message in
 * zs_errmsg(), except zs_jschema_feed / zs_jschema_done which return verdicts (1 / 0). */
#ifndef ZS_JSONSCHEMA_H
#define ZS_JSONSCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Indent bytes after a newline. llama.cpp's json.gbnf allows 20; 8 is enough for 4 levels of
 * 2-space or 2 of 4-space pretty-printing (deeper keys still come, indented less) and caps a gap at
 * 9 bytes: a tokenizer without space runs spends a token per byte, and a tiny model tends to take
 * the whole bound (stories260K, max_tokens 60: at 20 its answer was cut, at 8 it ends). */
#define ZS_JSCHEMA_MAX_INDENT 8
#define ZS_JSCHEMA_MAX_DEPTH 32   /* frames per stack (root + nested values + key) */
#define ZS_JSCHEMA_MAX_ALTS 16    /* live anyOf alternatives */
#define ZS_JSCHEMA_MAX_FRAMES 128 /* frames over all alternatives */
#define ZS_JSCHEMA_MAX_INT_DIGITS 18  /* digits of a number's integer part (fits int64) */
#define ZS_JSCHEMA_MAX_FRAC_DIGITS 18 /* digits after '.' */
#define ZS_JSCHEMA_MAX_EXP_DIGITS 2   /* digits of the exponent (|value| stays a finite double) */

typedef struct zs_jschema zs_jschema;

typedef struct {
    uint16_t node;  /* grammar node */
    uint8_t phase;  /* where inside that node */
    uint8_t ws;     /* whitespace in the current gap: 0 none, 1 a space, 2 + k a newline and k indent bytes */
    uint32_t a;     /* phase data (count, key/enum position, UTF-8 state, property) */
    uint64_t b;     /* phase data (keys seen, candidate range) */
} zs_jschema_frame;

/* The matcher's position: a set of live parse stacks (more than one only while anyOf
 * alternatives are undecided). Start from zs_jschema_state_init. */
typedef struct {
    uint16_t n_alt;
    uint16_t n_frames;
    uint8_t depth[ZS_JSCHEMA_MAX_ALTS];
    zs_jschema_frame f[ZS_JSCHEMA_MAX_FRAMES]; /* alternative i's frames follow alternative i-1's */
} zs_jschema_state;

/* schema_json: a JSON Schema document (NUL-terminated). ZS_EINVAL: not JSON, not an object
 * root, or an unsupported keyword/value (message names it and its pointer); ZS_ENOMEM. */
int zs_jschema_compile(const char *schema_json, zs_jschema **out);
/* Any JSON object (OpenAI's response_format {"type":"json_object"}). */
int zs_jschema_any_object(zs_jschema **out);
void zs_jschema_free(zs_jschema *g);

/* The state before the first byte. */
void zs_jschema_state_init(const zs_jschema *g, zs_jschema_state *st);
void zs_jschema_state_copy(zs_jschema_state *dst, const zs_jschema_state *src);
/* Feeds n bytes: 1 = all accepted (st advanced), 0 = rejected (st unchanged). */
int zs_jschema_feed(const zs_jschema *g, zs_jschema_state *st, const char *bytes, size_t n);
/* 1 when the bytes fed so far form a complete value (nothing more may follow). */
int zs_jschema_done(const zs_jschema *g, const zs_jschema_state *st);
/* The bytes the grammar forces from st (jump-forward decoding): while exactly one byte can come
 * next and the value is not complete, that byte, fed; at most cap of them into out (not
 * NUL-terminated). E.g. the root's '{'; after '{' nothing (whitespace may come), but after
 * '{"' or '{ ' of an object whose first property is required, the rest of the key and its quote
 * (then ':' or whitespace: a choice again); the rest of an enum value once one is left; '}' or ']'
 * after whitespace once nothing else can close. Returns how many; *done (may be NULL): the value is complete after them. st unchanged.
 * 0 for a NULL argument. */
size_t zs_jschema_forced(const zs_jschema *g, const zs_jschema_state *st, char *out, size_t cap, int *done);

/* Token masks. zs_jschema_mask_new builds a byte trie of every token's bytes
 * (zs_tokenizer_token_bytes; special tokens other than EOS and empty tokens are never allowed).
 * ZS_EINVAL (NULL argument), ZS_ENOMEM. */
typedef struct zs_jschema_masks zs_jschema_masks;
int zs_jschema_mask_new(const zs_jschema *g, const zs_tokenizer *tok, zs_jschema_masks **out);
void zs_jschema_mask_free(zs_jschema_masks *m);
/* Words of allowed_bits the caller provides: (vocab_size + 31) / 32. */
size_t zs_jschema_mask_words(const zs_jschema_masks *m);
/* Sets bit id (allowed_bits[id / 32] >> (id % 32) & 1) of every token the matcher accepts
 * from st, and of every EOS id exactly when zs_jschema_done(st); clears all others.
 * Returns the number of allowed tokens (0: a dead end, which a supported schema never reaches
 * except at the depth cap). */
int zs_jschema_mask(const zs_jschema_masks *m, const zs_jschema_state *st, uint32_t *allowed_bits);
/* Spells bytes[0..n) in tokens the masks may allow (no special or empty token): at each place
 * the longest token that is a prefix of what is left; among tokens of the same bytes a piece
 * before a byte-fallback token (zs_tokenizer_is_byte_fallback), then the lowest id. Up to k ids
 * into ids; returns how many, *used the bytes they cover (less than n when k
 * ran out or no token starts with the next byte). For zs_jschema_forced's bytes this is one
 * spelling among possibly several; the scheduler verifies it against the model's choice. */
int zs_jschema_mask_spell(const zs_jschema_masks *m, const char *bytes, size_t n, int32_t *ids, int k, size_t *used);

#endif
