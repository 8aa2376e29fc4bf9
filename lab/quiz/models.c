#include "lab/quiz/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab/quiz/data.h"

static int read_model(quiz_data_file* f, quiz_model* m, error_info* err) {
    char* name = NULL;
    if (quiz_data_string(f, "name", true, &name, err)) return -1;
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(f->where, sizeof f->where, "model %s", name);
    free(name);
    struct {
        const char* field;
        int* out;
    } fields[] = {
        {"n_layers", &m->n_layers},
        {"d_model", &m->d_model},
        {"n_heads", &m->n_heads},
        {"n_kv_heads", &m->n_kv_heads},
        {"head_dim", &m->head_dim},
        {"vocab_size", &m->vocab_size},
        {"intermediate_size", &m->intermediate_size},
        {"max_position_embeddings", &m->context_tokens},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (quiz_data_int(f, fields[i].field, true, 1, 1 << 24, fields[i].out, err)) return -1;
    if (quiz_data_bool(f, "tied_embeddings", true, &m->tied_embeddings, err)) return -1;
    if (m->context_tokens < QUIZ_MIN_CONTEXT_TOKENS)
        return error_set(err, "%s: %s: field 'max_position_embeddings': expected at least %d tokens, found %d", f->path,
                         f->where, QUIZ_MIN_CONTEXT_TOKENS, m->context_tokens);
    if (m->n_heads % m->n_kv_heads != 0)
        return error_set(err, "%s: %s: n_kv_heads %d does not divide n_heads %d", f->path, f->where, m->n_kv_heads,
                         m->n_heads);
    if ((long)m->n_heads * m->head_dim != m->d_model)
        return error_set(err, "%s: %s: n_heads x head_dim = %ld, expected d_model %d", f->path, f->where,
                         (long)m->n_heads * m->head_dim, m->d_model);
    return 0;
}

int quiz_models_load(const char* path, quiz_model_list* list, error_info* err) {
    memset(list, 0, sizeof *list);
    quiz_data_file f;
    if (quiz_data_open(&f, path, err)) return -1;
    int n = quiz_data_count(&f), status = 0;
    if (n < 1)
        status = error_set(err, "%s: no models", path);
    else if (!(list->models = calloc((size_t)n, sizeof *list->models)))
        status = error_set(err, "%s: out of memory", path);
    for (int i = 0; i < n && status == 0; i++) {
        if (quiz_data_enter_entry(&f, i + 1, err)) {
            status = -1;
            break;
        }
        status = read_model(&f, &list->models[i], err);
        quiz_data_leave(&f);
        list->n_models = i + 1;
    }
    quiz_data_close(&f);
    if (status) quiz_models_free(list);
    return status;
}

void quiz_models_free(quiz_model_list* list) {
    free(list->models);
    list->models = NULL;
    list->n_models = 0;
}

uint64_t quiz_model_params(const quiz_model* m) {
    uint64_t d = (uint64_t)m->d_model, q_width = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
    uint64_t kv_width = (uint64_t)m->n_kv_heads * (uint64_t)m->head_dim;
    uint64_t attention = 2 * d * q_width + 2 * d * kv_width;        // wq, wo; wk, wv
    uint64_t feed_forward = 3 * d * (uint64_t)m->intermediate_size; // gate, up, down
    uint64_t per_layer = attention + feed_forward + 2 * d;          // + two norms
    uint64_t embedding = (uint64_t)m->vocab_size * d;
    return embedding * (m->tied_embeddings ? 1 : 2) + (uint64_t)m->n_layers * per_layer + d;
}

uint64_t quiz_model_kv_bytes_per_token(const quiz_model* m, bool grouped_query, int bytes_per_value) {
    uint64_t heads = (uint64_t)(grouped_query ? m->n_kv_heads : m->n_heads);
    return 2 * (uint64_t)m->n_layers * heads * (uint64_t)m->head_dim * (uint64_t)bytes_per_value;
}
