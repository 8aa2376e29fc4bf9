// quiz_bank: the question bank (quiz/bank.lua) and the topics it is tagged with.
//
// Every item of shared/seed/question-bank.txt is one quiz_item: a kind
// (how it is asked and graded), topic tags, the id of the lesson check
// that proves it (lessons/*.lua), the prompt, the answer and a short
// explanation, each in English and optionally in Hinglish.
#ifndef SERVELAB_QUIZ_BANK_H
#define SERVELAB_QUIZ_BANK_H

#include <stdbool.h>

#include "base/error.h"

// ---- topics ----------------------------------------------------------------------------

typedef enum quiz_topic {
    QUIZ_TOPIC_KV_SIZING = 0,
    QUIZ_TOPIC_PAGED,
    QUIZ_TOPIC_BATCHING,
    QUIZ_TOPIC_ROOFLINE,
    QUIZ_TOPIC_QUANTIZATION,
    QUIZ_TOPIC_AWQ_GPTQ,
    QUIZ_TOPIC_PARALLELISM,
    QUIZ_TOPIC_COUNT
} quiz_topic;

#define QUIZ_TOPIC_BIT(topic) (1u << (topic))
#define QUIZ_ALL_TOPICS ((1u << QUIZ_TOPIC_COUNT) - 1u)

// "kv-sizing", "paged", ... as written in the bank and on the command line.
const char* quiz_topic_name(quiz_topic topic);
// The topic named `name`, or -1.
int quiz_topic_parse(const char* name);
// "kv-sizing, paged" for a topic mask (into out).
void quiz_topics_format(unsigned topics, char* out, int capacity);

// ---- items -----------------------------------------------------------------------------

typedef enum quiz_kind {
    QUIZ_KIND_TRUE_FALSE = 0, // answer true/false, then the student grades their justification
    QUIZ_KIND_SPOT_ERROR,     // what is wrong with a statement
    QUIZ_KIND_WHY,
    QUIZ_KIND_EDGE,
    QUIZ_KIND_RECALL,
    QUIZ_KIND_COUNT
} quiz_kind;

// "true_false", "spot_error", "why", "edge", "recall": as in bank.lua and
// as the seed sections are named in quiz_item.seed_section.
const char* quiz_kind_name(quiz_kind kind);

typedef enum quiz_lang { QUIZ_LANG_EN = 0, QUIZ_LANG_HI_EN = 1 } quiz_lang;

typedef struct quiz_text {
    char* en;
    char* hi_en; // NULL when the bank has no Hinglish rendering (English is shown)
} quiz_text;

// The text in `lang`, falling back to English.
const char* quiz_text_get(const quiz_text* t, quiz_lang lang);

enum { QUIZ_MAX_CHOICES = 6, QUIZ_ID_CAPACITY = 32 };

typedef struct quiz_item {
    char id[QUIZ_ID_CAPACITY]; // "tf1"
    quiz_kind kind;
    unsigned topics;              // QUIZ_TOPIC_BIT mask, at least one
    char claim[QUIZ_ID_CAPACITY]; // the lesson check id ("tf1")
    // Where it comes from in shared/seed/question-bank.txt: the section
    // (a quiz_kind name), the 1-based position in it, and words of the seed
    // question. A claim beyond the bank (the lab's own) has no seed.
    bool beyond_bank;
    quiz_kind seed_section;
    int seed_index;
    char* seed_match;
    quiz_text prompt;
    quiz_text explanation;
    // The answer, by form: true/false; a choice; or a model answer in text.
    bool has_truth;
    bool truth;
    int n_choices;                       // 0 when not multiple choice
    quiz_text choices[QUIZ_MAX_CHOICES]; // (n_choices)
    int correct_choice;                  // 0-based, valid when n_choices > 0
    quiz_text model_answer;              // text answers (why, recall); en NULL otherwise
} quiz_item;

typedef struct quiz_bank {
    quiz_item* items; // (n_items)
    int n_items;
} quiz_bank;

// Loads and validates bank.lua: every item has an id (unique), a kind,
// topics, a claim, a seed reference (or beyond_bank = true), a prompt, an answer of the form its
// kind needs, and an explanation. 0, or -1 with err naming the item and field.
int quiz_bank_load(const char* path, quiz_bank* bank, error_info* err);
void quiz_bank_free(quiz_bank* bank);
const quiz_item* quiz_bank_find(const quiz_bank* bank, const char* id);

#endif
