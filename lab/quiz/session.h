// quiz_session: one quiz sitting as pure functions: which questions to ask
// (Leitner order), the text of each, grading an answer line, and recording
// the result in the progress. No I/O here: lab/cmd/quiz.c reads lines or
// keys and prints or draws what the session says, so the same logic runs in
// the plain terminal, the ncurses view and the tests.
//
// A question moves through stages:
//   ASK         the question is shown; the next line is the answer
//   SELF_GRADE  true/false answered right, or a text answer given: the
//               justification or model answer is shown and the student
//               says whether theirs matched (y/n)
//   FEEDBACK    graded and recorded; the explanation is shown. 'p' proves
//               the claim with its lesson check; anything else moves on
//   DONE        no questions left (or the student quit)
#ifndef SERVELAB_QUIZ_SESSION_H
#define SERVELAB_QUIZ_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "lab/quiz/bank.h"
#include "lab/quiz/drills.h"
#include "lab/quiz/progress.h"

typedef struct quiz_question {
    char id[QUIZ_ID_CAPACITY]; // bank id or drill id: the progress key
    unsigned topics;
    const quiz_item* item;              // NULL for a drill
    quiz_drill drill;                   // valid when item is NULL
    int choice_order[QUIZ_MAX_CHOICES]; // shown position -> item choice index
    bool ahead_of_schedule;             // not due yet: asked because too few items were due
} quiz_question;

typedef enum quiz_stage { QUIZ_STAGE_ASK = 0, QUIZ_STAGE_SELF_GRADE, QUIZ_STAGE_FEEDBACK, QUIZ_STAGE_DONE } quiz_stage;

typedef enum quiz_input_result {
    QUIZ_INPUT_RETRY = 0,  // could not read the line: ask again (feedback says why)
    QUIZ_INPUT_SELF_GRADE, // now waiting for y/n
    QUIZ_INPUT_GRADED,     // recorded; stage is FEEDBACK
    QUIZ_INPUT_QUIT,       // 'q': the session is over
} quiz_input_result;

typedef struct quiz_session_options {
    unsigned topics; // QUIZ_TOPIC_BIT mask; QUIZ_ALL_TOPICS for all
    int n_questions; // at most this many
    uint64_t seed;   // drills and order
    quiz_lang lang;
    int64_t now;      // Unix seconds, for due dates
    bool bank_only;   // leave the drills out
    bool drills_only; // leave the bank out
} quiz_session_options;

typedef struct quiz_session {
    quiz_session_options options;
    quiz_progress* progress; // not owned; answers are recorded here
    quiz_rng rng;
    quiz_question* questions; // (n_questions)
    int n_questions;
    int current;
    quiz_stage stage;
    bool pending_right; // SELF_GRADE after true/false: the true/false part was right
    bool last_correct;  // FEEDBACK: how the last question was graded
    int n_correct, n_wrong;
    char feedback[4096]; // what to show after the last input
} quiz_session;

// Picks the questions: items and drills of the chosen topics, due ones
// first (lowest box first, previously wrong before new), topped up with
// items not yet due when fewer than n are due; drills get fresh numbers.
int quiz_session_start(quiz_session* s, const quiz_session_options* options, const quiz_bank* bank,
                       const quiz_model_list* models, quiz_progress* progress, error_info* err);
void quiz_session_free(quiz_session* s);

// The current question (NULL when DONE).
const quiz_question* quiz_session_question(const quiz_session* s);
// The question as text: "[2/10] tf3 (kv-sizing)", the prompt, the choices,
// and how to answer.
void quiz_session_format_question(const quiz_session* s, char* out, int capacity);
// What the next line should be, for the prompt: "true or false", "y or n", ...
const char* quiz_session_input_hint(const quiz_session* s);
// The same in at most 20 columns, for narrow terminals ("t or f", "p or Enter").
const char* quiz_session_input_hint_short(const quiz_session* s);

// Feeds one line of input to the current stage (ASK or SELF_GRADE).
// "q" or "quit" ends the session.
quiz_input_result quiz_session_input(quiz_session* s, const char* line, error_info* err);

// FEEDBACK -> the next question's ASK (or DONE).
void quiz_session_next(quiz_session* s);

// The lesson claim of the current question, when it has one (bank items).
const char* quiz_session_claim(const quiz_session* s);

// "Prove it": runs the lesson check with id `claim_id` from the lessons in
// `lessons_dir` headless and prints its verdict line (PASS/DISAGREE with
// the measured evidence) to `out`. 0 when the check ran, -1 with err when
// it could not. lab/quiz/app.h's quiz_app holds one of these (prove) and
// the folder; lab/lesson/lesson.h's lesson_prove_claim fits it through a
// wrapper that says what runs.
typedef int (*quiz_prove_fn)(const char* lessons_dir, const char* claim_id, FILE* out, error_info* err);

// Accuracy per topic and items due now, as a table.
void quiz_stats_print(FILE* out, const quiz_bank* bank, const quiz_progress* progress, int64_t now);

#endif
