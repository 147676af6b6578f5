/* data.h — training data for fine-tuning: a JSONL file of examples, validated (without a
 * tokenizer, for uploads) or loaded and tokenized with the model's tokenizer, and cut into fixed
 * [B, T] micro-batches of tokens and next-token targets in a seeded, resumable shuffle.
 *
 * File format: UTF-8, one JSON object per line, one of
 *   {"text": "..."}                                -> every token counts in the loss
 *   {"prompt": "...", "completion": "..."}         -> only the completion's tokens count
 *   {"messages": [{"role": .., "content": ..}, ...]} -> the chat template is applied; only the
 *                                                     assistant turns count
 * Other keys are ignored; exactly one of the three shapes must be present. roles are "system",
 * "user", "assistant" (or "developer", read as system, as in chat.h); content must be a string;
 * a messages example needs at least one assistant message. Empty (all-whitespace) lines are
 * allowed only at the end of the file. Lines may end in "\r\n".
 *
 * Tokenization (zs_data_load):
 *   text        encode(text) with the tokenizer's post-processing (BOS per its rules), then EOS.
 *   prompt/completion  encode(prompt + completion) as ONE string (the strings are concatenated
 *               as they are: write the separating space yourself, e.g. completion " there was"),
 *               then EOS. The loss covers the tokens from the first token that holds a byte of
 *               the completion, and the EOS.
 *   messages    rendered with zs_chat_render(chat_template, add_generation_prompt = 0, the
 *               tokenizer's bos/eos pieces) and encoded as one string (add_special only when the
 *               template does not write BOS itself). The loss covers each assistant turn: its
 *               content plus the template's end of turn (" </s>" llama-2, "<|eot_id|>" llama-3,
 *               "<|im_end|>" chatml, "<end_of_turn>" gemma, "<|end|>" phi3); the plain template has no end-of-turn token, so the EOS id
 *               is inserted after each assistant content (before the "\n") and counted.
 *   A token that straddles a boundary between prompt and answer text counts as the answer's.
 *   Boundaries are found by encoding the text up to each one (exact for every tokenizer); this
 *   costs O(turns x length) per conversation, so an example whose boundary encodings would
 *   exceed 64 x its length + 4 MiB (e.g. hundreds of turns in a long conversation) is refused
 *   (ZS_ERANGE "line N: conversation too long ..."): split it into shorter examples.
 *   EOS is appended / inserted only when the tokenizer has one (zs_tokenizer_eos >= 0).
 *   Special tokens written literally in the text (e.g. "</s>") are matched as their ids, as in
 *   serving.
 *
 * Batching (zs_data_next_batch): one example per row (attention never crosses examples), row r
 * of tokens = the example's first T tokens, targets[r][t] = token t+1 when it counts in the loss,
 * else -1. Examples longer than T + 1 tokens are TRUNCATED (their tail is not seen); shorter rows
 * are padded with token 0 and target -1. A row can therefore have no counted target at all
 * (e.g. an example whose answer starts after position T); the trainer must handle a batch whose
 * targets are all -1. The example order of epoch e is a Fisher-Yates shuffle seeded by
 * pos.seed + e (splitmix64), so the same seed gives the same order on every machine. pos.index
 * is the number of examples of epoch pos.epoch already handed out; saving {seed, epoch, index}
 * and passing it back resumes exactly. The last batch of an epoch may be partial
 * (*n_rows_filled < B; the unfilled rows are all padding); a batch never spans two epochs.
 *
 * Ownership: zs_data_load returns a dataset freed with zs_data_free. Thread-safety: validation
 * is pure; a dataset may be read (count/tokens/example) from several threads, but
 * zs_data_next_batch caches the current epoch's order in it: call it from one thread at a time.
 * Errors: 0 or a negative ZS_E* code with a message in zs_errmsg(); errors about the content name
 * the line: "line 7: \"completion\" must be a string". Out-parameters are set only on success. */
#ifndef ZS_DATA_H
#define ZS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

#define ZS_DATA_DEFAULT_MAX_BYTES ((size_t)100 << 20) /* 100 MiB */

typedef struct zs_dataset zs_dataset;

typedef struct {
    int chat_template; /* ZS_CHAT_* (chat.h): from zs_chat_template_detect or an override */
    size_t max_bytes;  /* file size limit; 0 = ZS_DATA_DEFAULT_MAX_BYTES */
    int max_examples;  /* > 0: load only the first max_examples examples; 0 = all */
} zs_data_opts;

/* Reads, validates and tokenizes path. o may be NULL (plain template, defaults).
 * ZS_EFORMAT / ZS_EINVAL with "line N: ..." for bad content, ZS_ERANGE over the size limit,
 * ZS_ENOTFOUND / ZS_EIO when the file cannot be read. */
int zs_data_load(const char *path, const zs_tokenizer *tok, const zs_data_opts *o, zs_dataset **out);

/* Validation without a tokenizer (uploads): every line is one of the three shapes with the right
 * types; returns the number of examples in *n_examples. max_bytes 0 = the default limit.
 * Empty file / only empty lines -> ZS_EFORMAT "file is empty". */
int zs_data_validate(const char *path, size_t max_bytes, int *n_examples);
int zs_data_validate_buf(const char *buf, size_t len, size_t max_bytes, int *n_examples);

void zs_data_free(zs_dataset *d);
int zs_data_count(const zs_dataset *d);   /* examples */
size_t zs_data_tokens(const zs_dataset *d); /* total tokens over all examples */
size_t zs_data_max_len(const zs_dataset *d); /* tokens of the longest example */

/* Example i (file order): its tokens and, per token, 1 when predicting it counts in the loss
 * (loss[0] is always 0: nothing predicts the first token). Pointers belong to the dataset. */
int zs_data_example(const zs_dataset *d, int i, const int32_t **tokens, const uint8_t **loss, size_t *n);

/* Batching (see above). tokens and targets are [B * T] row-major; pos is read and advanced.
 * ZS_EINVAL for B < 1, T < 1, a pos with epoch < 0 or index outside [0, count]. */
typedef struct {
    uint64_t seed;
    int epoch;
    long index;
} zs_data_pos;
int zs_data_next_batch(zs_dataset *d, zs_data_pos *pos, int B, int T, int32_t *tokens,
                       int32_t *targets, int *n_rows_filled);
long zs_data_batches_per_epoch(const zs_dataset *d, int B); /* ceil(count / B); 0 for B < 1 */

#endif
