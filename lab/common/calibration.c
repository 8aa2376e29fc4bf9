#include "lab/common/calibration.h"

#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/kv_memory.h"
#include "engine/sampler.h"

// Short stories in the style of TinyStories (written for servelab), for
// models with a real tokenizer. The two sets share no text, so what is
// measured on the evaluation set was not seen during calibration.
static const char* const CALIBRATION_STORIES[] = {
    "Once upon a time, there was a small cat named Tom. Tom liked to sit in the sun by the window. One day, a bird "
    "landed on the tree outside. Tom wanted to play with the bird, but the window was closed. He meowed and meowed. "
    "His friend Sue opened the window, and the bird sang a happy song for them both.",
    "Anna had a red ball. She liked to throw it high in the sky. One day the ball went over the fence. Anna was sad. "
    "She asked her dad for help. Dad smiled and climbed the fence. He gave the ball back to Anna. Anna hugged him and "
    "said thank you. They played together until it was time for dinner.",
    "There was a big dog who lived on a farm. The dog liked to run in the green grass. Every morning he said hello to "
    "the cows and the pigs. One day it rained, and the dog got very wet. The farmer gave him a warm towel. The dog "
    "was happy and fell asleep by the fire.",
    "Ben and Mia went to the park with their mom. They saw a duck in the pond. Mia gave the duck some bread. The duck "
    "quacked and swam in a circle. Ben laughed. Then they went on the swings. Mom pushed them high. It was a fun day, "
    "and they went home tired and happy.",
    "Once upon a time, a little girl named Lily found a shiny stone in the garden. She showed it to her brother. "
    "\"It is a magic stone,\" he said. Lily held it tight and made a wish. She wished for a sunny day. The next day "
    "the sun was bright, and Lily smiled at her stone.",
    "Max was a small boy who liked to build towers with blocks. He made a tall tower, taller than his chair. Then his "
    "little sister touched it and the tower fell down. Max was angry at first. Then he saw she wanted to help. They "
    "built a new tower together, and it was even better.",
    "One day, a friendly bear walked into the forest to find honey. He looked in a tree and saw a bee. \"Can I have "
    "some honey?\" asked the bear. The bee said yes, but only if the bear was gentle. The bear was very careful, and "
    "the bee shared the sweet honey with him.",
    "Sam had a toy car that could go very fast. He raced it across the kitchen floor. The car hit the table and a cup "
    "fell. Mom came to look. Sam said sorry and helped clean the floor. Mom was proud of him for telling the truth, "
    "and she gave him a cookie.",
};

static const char* const EVALUATION_STORIES[] = {
    "Once upon a time, there was a little fish who lived in a blue sea. The fish liked to swim with his friends. One "
    "day he saw a big boat. He was scared, but his friend the turtle said the boat was kind. They swam next to the "
    "boat and waved at the people.",
    "Lucy wanted to bake a cake for her grandma. She put flour and eggs in a bowl. Her dad helped her mix it. The cake "
    "went in the oven and smelled very good. When grandma came, Lucy gave her the cake. Grandma said it was the best "
    "cake she ever had.",
    "Tim saw a tiny frog on a leaf. The frog jumped into the water. Tim wanted to catch it, but his mom said to let it "
    "be free. Tim watched the frog swim away. He waved goodbye and went to play in the sand with his new shovel.",
    "There was a kind girl named Rose who had a garden full of flowers. Every day she gave them water. One morning a "
    "butterfly came to visit. It sat on a yellow flower. Rose was so happy that she danced in the garden, and the "
    "butterfly flew around her.",
    "Jack and his friend played hide and seek in the house. Jack hid under the bed. His friend looked everywhere but "
    "could not find him. At last Jack laughed and his friend found him. Then it was his turn to hide, and he hid "
    "behind the big chair.",
    "A little bird wanted to learn to fly. She flapped her wings, but she fell down. Her mother said to try again. The "
    "bird tried again and again. At last she flew up high over the trees. She was proud, and her mother sang a happy "
    "song.",
};

// Synthetic models have no text of their own: their streams are sampled
// from the unquantized model itself (temperature 1), one seed per purpose.
static int sample_streams(const model* m, uint64_t seed, int n_sequences, int length, calibration_set* out,
                          error_info* err) {
    const model_config* c = &m->config;
    if (length > c->max_seq_len) length = c->max_seq_len;
    int block_size = 16, n_blocks = (length + block_size - 1) / block_size;
    kv_memory kv;
    forward_state state;
    sampler sampling;
    if (kv_memory_init(&kv, c, KV_F32, n_blocks, block_size, err)) return -1;
    if (forward_state_init(&state, c, 1, length, err) || sampler_init(&sampling, c->vocab_size, 1.0f, 0.0f, seed, err)) {
        forward_state_free(&state);
        kv_memory_free(&kv);
        return -1;
    }
    int32_t* table = malloc((size_t)n_blocks * sizeof *table); // (n_blocks) identity
    float* logits = malloc((size_t)c->vocab_size * sizeof *logits);
    int status = (!table || !logits) ? error_set(err, "calibration: out of memory") : 0;
    for (int b = 0; status == 0 && b < n_blocks; b++) table[b] = b;
    const int32_t* tables[1] = {table};
    for (int q = 0; status == 0 && q < n_sequences; q++) {
        int32_t* tokens = malloc((size_t)length * sizeof *tokens);
        if (!tokens) {
            status = error_set(err, "calibration: out of memory");
            break;
        }
        out->sequences[q] = tokens;
        tokens[0] = 1; // BOS
        for (int t = 0; t < length - 1 && status == 0; t++) {
            batch_row row = {tokens[t], t, 0, true};
            int32_t slot;
            forward_batch_map_slots(&slot, &row, 1, tables, block_size);
            forward_batch batch = {1, &row, 1, tables, &slot};
            status = forward(m, &state, &kv, &batch, logits, NULL, err);
            int32_t next = sampler_sample(&sampling, logits);
            tokens[t + 1] = next < 3 ? 3 + next : next; // keep the stream free of BOS/EOS
        }
        out->lengths[q] = length;
        out->n_sequences++;
    }
    free(table);
    free(logits);
    sampler_free(&sampling);
    forward_state_free(&state);
    kv_memory_free(&kv);
    return status;
}

int calibration_build(const model* m, const tokenizer* tok, calibration_purpose purpose, calibration_set* out,
                      error_info* err) {
    memset(out, 0, sizeof *out);
    bool text = tok && !tok_is_byte_level(tok) && tok_vocab_size(tok) == m->config.vocab_size;
    const char* const* stories = purpose == CALIBRATION_FOR_QUANTIZATION ? CALIBRATION_STORIES : EVALUATION_STORIES;
    int n_stories = purpose == CALIBRATION_FOR_QUANTIZATION
                        ? (int)(sizeof CALIBRATION_STORIES / sizeof CALIBRATION_STORIES[0])
                        : (int)(sizeof EVALUATION_STORIES / sizeof EVALUATION_STORIES[0]);
    int n_sequences = text ? n_stories : 4;
    out->sequences = calloc((size_t)n_sequences, sizeof *out->sequences);
    out->lengths = calloc((size_t)n_sequences, sizeof *out->lengths);
    if (!out->sequences || !out->lengths) {
        calibration_free(out);
        return error_set(err, "calibration: out of memory");
    }
    out->from_text = text;
    if (!text) {
        uint64_t seed = purpose == CALIBRATION_FOR_QUANTIZATION ? 1001 : 2002;
        if (sample_streams(m, seed, n_sequences, 128, out, err)) {
            calibration_free(out);
            return -1;
        }
        return 0;
    }
    // A story longer than the model's context is cut to its first
    // max_seq_len tokens (a GGUF from llama.cpp's llama2.c converter says
    // 128, and the longest story is 131 tokens).
    const bool add_bos = tok_adds_bos(tok);
    for (int q = 0; q < n_stories; q++) {
        int needed = 0;
        tok_encode(tok, stories[q], add_bos, false, NULL, 0, &needed, NULL); // counts, never refused
        out->sequences[q] = malloc((size_t)(needed > 0 ? needed : 1) * sizeof(int32_t));
        if (!out->sequences[q]) {
            calibration_free(out);
            return error_set(err, "calibration: out of memory");
        }
        out->n_sequences++;
        if (tok_encode(tok, stories[q], add_bos, false, out->sequences[q], needed, &out->lengths[q], err)) {
            calibration_free(out);
            return -1;
        }
        if (out->lengths[q] > m->config.max_seq_len) out->lengths[q] = m->config.max_seq_len;
    }
    return 0;
}

void calibration_free(calibration_set* set) {
    if (set->sequences)
        for (int i = 0; i < set->n_sequences; i++) free(set->sequences[i]);
    free(set->sequences);
    free(set->lengths);
    memset(set, 0, sizeof *set);
}
