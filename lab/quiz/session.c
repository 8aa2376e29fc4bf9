#include "lab/quiz/session.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- choosing the questions ------------------------------------------------------------

typedef struct candidate {
    const quiz_item* item; // or
    int drill_kind;        // -1 for an item
    double order;          // ascending: asked first
    bool due;
} candidate;

static int compare_candidates(const void* a, const void* b) {
    double x = ((const candidate*)a)->order, y = ((const candidate*)b)->order;
    return (x > y) - (x < y);
}

// Due items before the rest; among them the lowest box first, with box 1
// (answered wrong last time) before box 0 (never seen); a random offset
// below half a box breaks ties, so equal items come in a fresh order.
static double candidate_order(const quiz_record* r, bool due, quiz_rng* rng) {
    int box = r ? r->box : 0;
    double rank = box == 0 ? 1.5 : (double)box;
    return (due ? 0.0 : 100.0) + rank + 0.49 * quiz_rng_unit(rng);
}

static void shuffle_ints(int* values, int n, quiz_rng* rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = quiz_rng_int(rng, 0, i), t = values[i];
        values[i] = values[j];
        values[j] = t;
    }
}

int quiz_session_start(quiz_session* s, const quiz_session_options* options, const quiz_bank* bank,
                       const quiz_model_list* models, quiz_progress* progress, error_info* err) {
    memset(s, 0, sizeof *s);
    s->options = *options;
    s->progress = progress;
    quiz_rng_seed(&s->rng, options->seed);
    int capacity = bank->n_items + QUIZ_DRILL_COUNT, n = 0;
    candidate* candidates = calloc((size_t)capacity, sizeof *candidates);
    if (!candidates) return error_set(err, "quiz: out of memory");
    for (int i = 0; i < bank->n_items && !options->drills_only; i++) {
        const quiz_item* item = &bank->items[i];
        if (!(item->topics & options->topics)) continue;
        const quiz_record* r = quiz_progress_find(progress, item->id);
        bool due = quiz_record_due(r, options->now);
        candidates[n++] = (candidate){item, -1, candidate_order(r, due, &s->rng), due};
    }
    for (int k = 0; k < QUIZ_DRILL_COUNT && !options->bank_only; k++) {
        if (!(quiz_drill_topics((quiz_drill_kind)k) & options->topics)) continue;
        const quiz_record* r = quiz_progress_find(progress, quiz_drill_id((quiz_drill_kind)k));
        bool due = quiz_record_due(r, options->now);
        candidates[n++] = (candidate){NULL, k, candidate_order(r, due, &s->rng), due};
    }
    if (n == 0) {
        free(candidates);
        return error_set(err, "quiz: no questions for the chosen topic");
    }
    qsort(candidates, (size_t)n, sizeof *candidates, compare_candidates);
    int count = options->n_questions < n ? options->n_questions : n;
    if (count < 1) count = 1;
    s->questions = calloc((size_t)count, sizeof *s->questions);
    if (!s->questions) {
        free(candidates);
        return error_set(err, "quiz: out of memory");
    }
    // Ask the chosen ones in a shuffled order, so that topics and kinds mix.
    int order[512];
    int shown = count < 512 ? count : 512;
    for (int i = 0; i < shown; i++)
        order[i] = i;
    shuffle_ints(order, shown, &s->rng);
    for (int i = 0; i < shown; i++) {
        const candidate* c = &candidates[order[i]];
        quiz_question* q = &s->questions[i];
        q->ahead_of_schedule = !c->due;
        if (c->item) {
            q->item = c->item;
            q->topics = c->item->topics;
            snprintf(q->id, sizeof q->id, "%s", c->item->id);
            for (int k = 0; k < c->item->n_choices; k++)
                q->choice_order[k] = k;
            shuffle_ints(q->choice_order, c->item->n_choices, &s->rng);
        } else {
            if (quiz_drill_generate((quiz_drill_kind)c->drill_kind, models, &s->rng, &q->drill, err)) {
                free(candidates);
                quiz_session_free(s);
                return -1;
            }
            q->topics = quiz_drill_topics((quiz_drill_kind)c->drill_kind);
            snprintf(q->id, sizeof q->id, "%s", quiz_drill_id((quiz_drill_kind)c->drill_kind));
        }
    }
    s->n_questions = shown;
    free(candidates);
    s->stage = QUIZ_STAGE_ASK;
    return 0;
}

void quiz_session_free(quiz_session* s) {
    free(s->questions);
    s->questions = NULL;
    s->n_questions = 0;
}

const quiz_question* quiz_session_question(const quiz_session* s) {
    if (s->stage == QUIZ_STAGE_DONE || s->current >= s->n_questions) return NULL;
    return &s->questions[s->current];
}

// ---- showing a question ----------------------------------------------------------------

static const char* kind_label(const quiz_question* q) {
    if (!q->item) return "Drill";
    switch (q->item->kind) {
    case QUIZ_KIND_TRUE_FALSE: return "True or false";
    case QUIZ_KIND_SPOT_ERROR: return "Spot the error";
    case QUIZ_KIND_WHY: return "Why";
    case QUIZ_KIND_EDGE: return "Edge case";
    default: return "Recall";
    }
}

const char* quiz_session_input_hint(const quiz_session* s) {
    const quiz_question* q = quiz_session_question(s);
    if (!q) return "";
    if (s->stage == QUIZ_STAGE_SELF_GRADE) return "y or n";
    if (s->stage == QUIZ_STAGE_FEEDBACK)
        return quiz_session_claim(s) ? "p to prove it, Enter for the next" : "Enter for the next";
    if (!q->item) return q->drill.answer.unit[0] ? "a number, with a unit or in the unit asked" : "a number";
    if (q->item->has_truth) return "true or false (t/f)";
    if (q->item->n_choices > 0) return "a letter";
    return "your answer in a sentence (or Enter to see the model answer)";
}

const char* quiz_session_input_hint_short(const quiz_session* s) {
    const quiz_question* q = quiz_session_question(s);
    if (!q) return "";
    if (s->stage == QUIZ_STAGE_SELF_GRADE) return "y or n";
    if (s->stage == QUIZ_STAGE_FEEDBACK) return quiz_session_claim(s) ? "p or Enter" : "Enter: next";
    if (!q->item) return q->drill.answer.unit[0] ? "a number and unit" : "a number";
    if (q->item->has_truth) return "t or f";
    if (q->item->n_choices > 0) return "a letter";
    return "your answer";
}

void quiz_session_format_question(const quiz_session* s, char* out, int capacity) {
    out[0] = '\0';
    const quiz_question* q = quiz_session_question(s);
    if (!q) return;
    char topics[128];
    quiz_topics_format(q->topics, topics, sizeof topics);
    const char* prompt = q->item ? quiz_text_get(&q->item->prompt, s->options.lang) : q->drill.prompt;
    int used =
        snprintf(out, (size_t)capacity, "[%d/%d] %s: %s (%s)%s\n%s\n", s->current + 1, s->n_questions, kind_label(q),
                 q->id, topics, q->ahead_of_schedule ? " - not due yet, extra practice" : "", prompt);
    for (int k = 0; q->item && k < q->item->n_choices && used < capacity; k++)
        used += snprintf(out + used, (size_t)(capacity - used), "  %c) %s\n", 'a' + k,
                         quiz_text_get(&q->item->choices[q->choice_order[k]], s->options.lang));
}

const char* quiz_session_claim(const quiz_session* s) {
    const quiz_question* q = quiz_session_question(s);
    return q && q->item && q->item->claim[0] ? q->item->claim : NULL;
}

// ---- answering ---------------------------------------------------------------------------

// The line without surrounding blanks, lower-cased, into out.
static void normalise(const char* line, char* out, size_t capacity) {
    while (isspace((unsigned char)*line))
        line++;
    size_t n = strlen(line);
    while (n > 0 && isspace((unsigned char)line[n - 1]))
        n--;
    if (n >= capacity) n = capacity - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)tolower((unsigned char)line[i]);
    out[n] = '\0';
}

static int parse_yes_no(const char* word) {
    if (strcmp(word, "y") == 0 || strcmp(word, "yes") == 0) return 1;
    if (strcmp(word, "n") == 0 || strcmp(word, "no") == 0) return 0;
    return -1;
}

static int parse_truth(const char* word) {
    if (strcmp(word, "t") == 0 || strcmp(word, "true") == 0) return 1;
    if (strcmp(word, "f") == 0 || strcmp(word, "false") == 0) return 0;
    return -1;
}

// Records the grade and moves to FEEDBACK. `text` (already in s->feedback
// or given here) is followed by the prove-it hint when there is a claim.
static quiz_input_result grade(quiz_session* s, bool correct, error_info* err) {
    const quiz_question* q = quiz_session_question(s);
    if (quiz_progress_record(s->progress, q->id, correct, s->options.now, err)) return QUIZ_INPUT_RETRY;
    if (correct)
        s->n_correct++;
    else
        s->n_wrong++;
    s->last_correct = correct;
    s->stage = QUIZ_STAGE_FEEDBACK;
    const char* claim = quiz_session_claim(s);
    size_t used = strlen(s->feedback);
    if (claim && used < sizeof s->feedback)
        snprintf(s->feedback + used, sizeof s->feedback - used, "\n(p: prove it live with the lesson check '%s')",
                 claim);
    return QUIZ_INPUT_GRADED;
}

static quiz_input_result answer_numeric(quiz_session* s, const quiz_question* q, const char* line, error_info* err) {
    quiz_numeric_verdict verdict;
    if (quiz_check_numeric(&q->drill.answer, line, &verdict, err)) {
        snprintf(s->feedback, sizeof s->feedback, "%s", err->message);
        return QUIZ_INPUT_RETRY;
    }
    snprintf(s->feedback, sizeof s->feedback, "%s\nWorked: %s", verdict.feedback, q->drill.explanation);
    return grade(s, verdict.correct, err);
}

static quiz_input_result answer_item(quiz_session* s, const quiz_question* q, const char* word, error_info* err) {
    const quiz_item* item = q->item;
    const char* explanation = quiz_text_get(&item->explanation, s->options.lang);
    if (item->has_truth) {
        int truth = parse_truth(word);
        if (truth < 0) {
            snprintf(s->feedback, sizeof s->feedback, "Answer true or false (t or f).");
            return QUIZ_INPUT_RETRY;
        }
        const char* right = item->truth ? "True" : "False";
        if ((truth == 1) != item->truth) {
            snprintf(s->feedback, sizeof s->feedback, "Wrong: it is %s. %s", right, explanation);
            return grade(s, false, err);
        }
        s->pending_right = true;
        s->stage = QUIZ_STAGE_SELF_GRADE;
        snprintf(s->feedback, sizeof s->feedback,
                 "Right: it is %s. The justification:\n%s\nDid your reason match this one? (y/n)", right, explanation);
        return QUIZ_INPUT_SELF_GRADE;
    }
    if (item->n_choices > 0) {
        int shown = -1;
        if (strlen(word) == 1 && word[0] >= 'a' && word[0] < 'a' + item->n_choices) shown = word[0] - 'a';
        if (strlen(word) == 1 && word[0] >= '1' && word[0] < '1' + item->n_choices) shown = word[0] - '1';
        if (shown < 0) {
            snprintf(s->feedback, sizeof s->feedback, "Answer with a letter from a to %c.", 'a' + item->n_choices - 1);
            return QUIZ_INPUT_RETRY;
        }
        int right_shown = 0;
        for (int k = 0; k < item->n_choices; k++)
            if (q->choice_order[k] == item->correct_choice) right_shown = k;
        bool correct = shown == right_shown;
        snprintf(s->feedback, sizeof s->feedback, "%s: the answer is %c) %s\n%s", correct ? "Right" : "Wrong",
                 'a' + right_shown, quiz_text_get(&item->choices[item->correct_choice], s->options.lang), explanation);
        return grade(s, correct, err);
    }
    // A text answer: show the model answer and let the student compare.
    s->pending_right = true;
    s->stage = QUIZ_STAGE_SELF_GRADE;
    snprintf(s->feedback, sizeof s->feedback, "Model answer: %s\n(%s)\nDid yours say the same? (y/n)",
             quiz_text_get(&item->model_answer, s->options.lang), explanation);
    return QUIZ_INPUT_SELF_GRADE;
}

quiz_input_result quiz_session_input(quiz_session* s, const char* line, error_info* err) {
    const quiz_question* q = quiz_session_question(s);
    if (!q) return QUIZ_INPUT_QUIT;
    char word[256];
    normalise(line, word, sizeof word);
    if (strcmp(word, "q") == 0 || strcmp(word, "quit") == 0) {
        s->stage = QUIZ_STAGE_DONE;
        return QUIZ_INPUT_QUIT;
    }
    if (s->stage == QUIZ_STAGE_SELF_GRADE) {
        int yes = parse_yes_no(word);
        if (yes < 0) {
            snprintf(s->feedback, sizeof s->feedback, "Answer y or n: did yours match?");
            return QUIZ_INPUT_RETRY;
        }
        bool correct = s->pending_right && yes == 1;
        snprintf(s->feedback, sizeof s->feedback, "%s",
                 correct ? "Marked right." : "Marked wrong: review the reason above.");
        return grade(s, correct, err);
    }
    if (s->stage != QUIZ_STAGE_ASK) return QUIZ_INPUT_RETRY;
    if (!q->item) return answer_numeric(s, q, line, err);
    return answer_item(s, q, word, err);
}

void quiz_session_next(quiz_session* s) {
    if (s->stage == QUIZ_STAGE_DONE) return;
    s->current++;
    s->feedback[0] = '\0';
    s->pending_right = false;
    s->stage = s->current < s->n_questions ? QUIZ_STAGE_ASK : QUIZ_STAGE_DONE;
}

// ---- statistics ----------------------------------------------------------------------------

typedef struct topic_totals {
    int items, answered_items, correct, wrong, due;
} topic_totals;

static void add_item(topic_totals* totals, unsigned topics, const quiz_record* r, int64_t now) {
    for (int t = 0; t <= QUIZ_TOPIC_COUNT; t++) {
        if (t < QUIZ_TOPIC_COUNT && !(topics & QUIZ_TOPIC_BIT(t))) continue; // slot QUIZ_TOPIC_COUNT: all
        totals[t].items++;
        totals[t].due += quiz_record_due(r, now);
        if (!r) continue;
        totals[t].answered_items += r->n_correct + r->n_wrong > 0;
        totals[t].correct += r->n_correct;
        totals[t].wrong += r->n_wrong;
    }
}

void quiz_stats_print(FILE* out, const quiz_bank* bank, const quiz_progress* progress, int64_t now) {
    topic_totals totals[QUIZ_TOPIC_COUNT + 1];
    memset(totals, 0, sizeof totals);
    for (int i = 0; i < bank->n_items; i++)
        add_item(totals, bank->items[i].topics, quiz_progress_find(progress, bank->items[i].id), now);
    for (int k = 0; k < QUIZ_DRILL_COUNT; k++)
        add_item(totals, quiz_drill_topics((quiz_drill_kind)k),
                 quiz_progress_find(progress, quiz_drill_id((quiz_drill_kind)k)), now);
    fprintf(out, "%-14s %6s %6s %8s %8s %9s %8s\n", "topic", "items", "seen", "right", "wrong", "accuracy", "due now");
    for (int t = 0; t <= QUIZ_TOPIC_COUNT; t++) {
        const topic_totals* x = &totals[t];
        char accuracy[16];
        if (x->correct + x->wrong > 0)
            snprintf(accuracy, sizeof accuracy, "%.0f%%", 100.0 * x->correct / (double)(x->correct + x->wrong));
        else
            snprintf(accuracy, sizeof accuracy, "-");
        fprintf(out, "%-14s %6d %6d %8d %8d %9s %8d\n", t < QUIZ_TOPIC_COUNT ? quiz_topic_name((quiz_topic)t) : "all",
                x->items, x->answered_items, x->correct, x->wrong, accuracy, x->due);
    }
    // When the next item falls due, for a student who has answered everything.
    int64_t next_due = -1;
    for (int i = 0; i < progress->n_records; i++) {
        const quiz_record* r = &progress->records[i];
        int64_t at = r->last_seen + quiz_box_interval_seconds(r->box);
        if (at > now && (next_due < 0 || at < next_due)) next_due = at;
    }
    if (next_due > 0)
        fprintf(out, "next item not yet due falls due in %.1f hours\n", (double)(next_due - now) / 3600.0);
}
