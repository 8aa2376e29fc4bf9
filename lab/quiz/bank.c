#include "lab/quiz/bank.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab/quiz/data.h"

// ---- topics ----------------------------------------------------------------------------

static const char* const TOPIC_NAMES[QUIZ_TOPIC_COUNT] = {
    "kv-sizing", "paged", "batching", "roofline", "quantization", "awq-gptq", "parallelism",
};

const char* quiz_topic_name(quiz_topic topic) {
    return topic >= 0 && topic < QUIZ_TOPIC_COUNT ? TOPIC_NAMES[topic] : "?";
}

int quiz_topic_parse(const char* name) {
    for (int t = 0; t < QUIZ_TOPIC_COUNT; t++)
        if (strcmp(name, TOPIC_NAMES[t]) == 0) return t;
    return -1;
}

void quiz_topics_format(unsigned topics, char* out, int capacity) {
    int used = 0;
    out[0] = '\0';
    for (int t = 0; t < QUIZ_TOPIC_COUNT; t++)
        if (topics & QUIZ_TOPIC_BIT(t) && used < capacity)
            used += snprintf(out + used, (size_t)(capacity - used), "%s%s", used ? ", " : "", TOPIC_NAMES[t]);
}

static const char* const KIND_NAMES[QUIZ_KIND_COUNT] = {"true_false", "spot_error", "why", "edge", "recall"};

const char* quiz_kind_name(quiz_kind kind) { return kind >= 0 && kind < QUIZ_KIND_COUNT ? KIND_NAMES[kind] : "?"; }

static int kind_parse(const char* name) {
    for (int k = 0; k < QUIZ_KIND_COUNT; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0) return k;
    return -1;
}

const char* quiz_text_get(const quiz_text* t, quiz_lang lang) {
    return lang == QUIZ_LANG_HI_EN && t->hi_en ? t->hi_en : (t->en ? t->en : "");
}

// ---- loading ---------------------------------------------------------------------------

static void text_free(quiz_text* t) {
    free(t->en);
    free(t->hi_en);
    t->en = t->hi_en = NULL;
}

static void item_free(quiz_item* item) {
    free(item->seed_match);
    text_free(&item->prompt);
    text_free(&item->explanation);
    text_free(&item->model_answer);
    for (int c = 0; c < item->n_choices; c++)
        text_free(&item->choices[c]);
    memset(item, 0, sizeof *item);
}

// A string field copied into a fixed buffer.
static int read_id(quiz_data_file* f, const char* field, char* out, error_info* err) {
    char* text = NULL;
    if (quiz_data_string(f, field, true, &text, err)) return -1;
    int status = 0;
    if (strlen(text) >= QUIZ_ID_CAPACITY)
        status = error_set(err, "%s: %s: field '%s': longer than %d characters", f->path, f->where, field,
                           QUIZ_ID_CAPACITY - 1);
    else
        snprintf(out, QUIZ_ID_CAPACITY, "%s", text);
    free(text);
    return status;
}

static int read_topics(quiz_data_file* f, quiz_item* item, error_info* err) {
    char* names[QUIZ_TOPIC_COUNT] = {0};
    int n = 0, status = quiz_data_string_list(f, "topics", names, QUIZ_TOPIC_COUNT, &n, err);
    for (int k = 0; k < n; k++) {
        int topic = quiz_topic_parse(names[k]);
        if (topic < 0 && status == 0)
            status = error_set(err,
                               "%s: %s: field 'topics': unknown topic '%s' (expected kv-sizing, paged, batching, "
                               "roofline, quantization, awq-gptq or parallelism)",
                               f->path, f->where, names[k]);
        if (topic >= 0) item->topics |= QUIZ_TOPIC_BIT(topic);
        free(names[k]);
    }
    return status;
}

// seed = {section, index, match}, or beyond_bank = true for a claim the
// seed does not make (then seed must be absent).
static int read_seed(quiz_data_file* f, quiz_item* item, error_info* err) {
    if (quiz_data_bool(f, "beyond_bank", false, &item->beyond_bank, err)) return -1;
    int entered = quiz_data_enter_table(f, "seed", err);
    if (entered < 0) return -1;
    if (item->beyond_bank) {
        if (entered == 0) return 0;
        quiz_data_leave(f);
        return error_set(err, "%s: %s: an item beyond the bank has no field 'seed'", f->path, f->where);
    }
    if (entered == 0) return error_set(err, "%s: %s: field 'seed' is missing (or beyond_bank = true)", f->path, f->where);
    char* section = NULL;
    int status = quiz_data_string(f, "section", true, &section, err);
    if (status == 0) {
        int kind = kind_parse(section);
        if (kind < 0)
            status = error_set(err, "%s: %s: seed.section '%s' is not a kind", f->path, f->where, section);
        else
            item->seed_section = (quiz_kind)kind;
    }
    free(section);
    if (status == 0) status = quiz_data_int(f, "index", true, 1, 1000, &item->seed_index, err);
    if (status == 0) status = quiz_data_string(f, "match", true, &item->seed_match, err);
    quiz_data_leave(f);
    return status;
}

// The Hinglish renderings under hi_en = { prompt, explanation, answer }.
static int read_hinglish(quiz_data_file* f, quiz_item* item, error_info* err) {
    int entered = quiz_data_enter_table(f, "hi_en", err);
    if (entered <= 0) return entered;
    int status = quiz_data_string(f, "prompt", false, &item->prompt.hi_en, err);
    if (status == 0) status = quiz_data_string(f, "explanation", false, &item->explanation.hi_en, err);
    if (status == 0 && item->model_answer.en)
        status = quiz_data_string(f, "answer", false, &item->model_answer.hi_en, err);
    quiz_data_leave(f);
    return status;
}

// The answer field, in the form the item needs: a boolean (true_false), an
// index into choices, or the model answer's text.
static int read_answer(quiz_data_file* f, quiz_item* item, error_info* err) {
    const char* type = quiz_data_type(f, "answer");
    if (item->kind == QUIZ_KIND_TRUE_FALSE) {
        item->has_truth = true;
        return quiz_data_bool(f, "answer", true, &item->truth, err);
    }
    if (strcmp(quiz_data_type(f, "choices"), "nil") != 0) {
        char* choices[QUIZ_MAX_CHOICES] = {0};
        int n = 0;
        int status = quiz_data_string_list(f, "choices", choices, QUIZ_MAX_CHOICES, &n, err);
        for (int c = 0; c < n; c++)
            item->choices[c].en = choices[c];
        item->n_choices = n;
        if (status) return -1;
        if (n < 2) return error_set(err, "%s: %s: field 'choices': expected at least 2", f->path, f->where);
        int index = 0;
        if (quiz_data_int(f, "answer", true, 1, n, &index, err)) return -1;
        item->correct_choice = index - 1;
        return 0;
    }
    if (item->kind == QUIZ_KIND_SPOT_ERROR)
        return error_set(err, "%s: %s: a spot_error item needs choices", f->path, f->where);
    if (strcmp(type, "string") != 0)
        return error_set(err, "%s: %s: field 'answer': expected the model answer as a string, found a %s", f->path,
                         f->where, type);
    return quiz_data_string(f, "answer", true, &item->model_answer.en, err);
}

static int read_item(quiz_data_file* f, quiz_item* item, error_info* err) {
    char* kind = NULL;
    if (read_id(f, "id", item->id, err)) return -1;
    snprintf(f->where, sizeof f->where, "item %s", item->id);
    int status = quiz_data_string(f, "kind", true, &kind, err);
    if (status == 0) {
        int k = kind_parse(kind);
        if (k < 0)
            status = error_set(err,
                               "%s: %s: field 'kind': unknown kind '%s' (expected true_false, spot_error, why, "
                               "edge or recall)",
                               f->path, f->where, kind);
        else
            item->kind = (quiz_kind)k;
    }
    free(kind);
    if (status == 0) status = read_topics(f, item, err);
    if (status == 0) status = read_id(f, "claim", item->claim, err);
    if (status == 0) status = read_seed(f, item, err);
    if (status == 0) status = quiz_data_string(f, "prompt", true, &item->prompt.en, err);
    if (status == 0) status = read_answer(f, item, err);
    if (status == 0) status = quiz_data_string(f, "explanation", true, &item->explanation.en, err);
    if (status == 0) status = read_hinglish(f, item, err);
    return status;
}

int quiz_bank_load(const char* path, quiz_bank* bank, error_info* err) {
    memset(bank, 0, sizeof *bank);
    quiz_data_file f;
    if (quiz_data_open(&f, path, err)) return -1;
    int n = quiz_data_count(&f), status = 0;
    if (n < 1)
        status = error_set(err, "%s: the bank has no items", path);
    else if (!(bank->items = calloc((size_t)n, sizeof *bank->items)))
        status = error_set(err, "%s: out of memory", path);
    for (int i = 0; i < n && status == 0; i++) {
        if (quiz_data_enter_entry(&f, i + 1, err)) {
            status = -1;
            break;
        }
        bank->n_items = i + 1;
        status = read_item(&f, &bank->items[i], err);
        quiz_data_leave(&f);
        for (int j = 0; j < i && status == 0; j++)
            if (strcmp(bank->items[j].id, bank->items[i].id) == 0)
                status = error_set(err, "%s: item %d: id '%s' is used twice", path, i + 1, bank->items[i].id);
    }
    quiz_data_close(&f);
    if (status) quiz_bank_free(bank);
    return status;
}

void quiz_bank_free(quiz_bank* bank) {
    for (int i = 0; i < bank->n_items; i++)
        item_free(&bank->items[i]);
    free(bank->items);
    bank->items = NULL;
    bank->n_items = 0;
}

const quiz_item* quiz_bank_find(const quiz_bank* bank, const char* id) {
    for (int i = 0; i < bank->n_items; i++)
        if (strcmp(bank->items[i].id, id) == 0) return &bank->items[i];
    return NULL;
}
