// lesson checks: the declaration (lab.lesson) and lab.check, which turns a
// lesson's measurement into a verdict on one claim of the question bank.
#include <stdlib.h>
#include <string.h>

#include "lab/lesson/internal.h"

static lab_declared_claim* find_declared(lesson* l, const char* id) {
    for (int i = 0; i < l->n_declared; i++)
        if (strcmp(l->declared[i].id, id) == 0) return &l->declared[i];
    return NULL;
}

static void report_check(lesson* l, const lesson_check_result* result) {
    bool counted = !l->options.only_claim || strcmp(l->options.only_claim, result->id) == 0;
    if (!counted) return;
    if (result->outcome == CHECK_PASS) l->passed++;
    else if (result->outcome == CHECK_UNDECIDED) l->undecided++;
    else l->failed++;
    if (!l->options.on_check) return;
    // The claim and the evidence are the lesson's text: shown inert.
    lesson_check_result shown = *result;
    shown.running = fault_enabled_set;
    char* claim = lesson_clean_copy(result->claim, false);
    char* evidence = lesson_clean_copy(result->evidence, false);
    char* note = lesson_clean_copy(result->note ? result->note : "", false);
    if (claim) shown.claim = claim;
    if (evidence) shown.evidence = evidence;
    if (note) shown.note = note;
    if (claim && evidence && note) l->options.on_check(l->options.user, &shown);
    free(claim);
    free(evidence);
    free(note);
}

static bool valid_claim_id(const char* id) {
    size_t n = strlen(id);
    if (n == 0 || n >= sizeof ((lab_declared_claim*)0)->id) return false;
    for (const char* c = id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_')) return false;
    return true;
}

// lab.check{id=, claim=, bank_answer=, verdict=, evidence=} or with
// measure=function() return verdict, evidence end instead of verdict and
// evidence (an error inside measure is a FAIL line, not a failed lesson).
// bank_answer must be what the bank says (lesson_bank_claim_find); a claim
// the question bank does not make (the lab's own, beyond the bank) gives
// expected = what the lesson expects instead.
// breaks_with = {"no-cow", ...}: the faults (engine/fault.h) under which the
// verdict must turn; "" in problem when the list is well formed.
static fault_set read_breaks_with(lua_State* L, char* problem, size_t capacity) {
    fault_set set = 0;
    int type = lab_get_field(L, 1, "breaks_with");
    if (type == LUA_TNIL) {
        lua_pop(L, 1);
        return 0;
    }
    if (type != LUA_TTABLE) {
        snprintf(problem, capacity, "field 'breaks_with': expected an array of fault names, got %s", luaL_typename(L, -1));
    } else {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= n && !problem[0]; i++) {
            const char* name = lua_rawgeti(L, -1, i) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            int id = name ? fault_lookup(name) : -1;
            if (id < 0)
                snprintf(problem, capacity, "field 'breaks_with': item %lld is not a fault name%s%.40s%s "
                         "(servelab info --faults lists them)", (long long)i, name ? " ('" : "", name ? name : "",
                         name ? "')" : "");
            else set |= (fault_set)1 << id;
            lua_pop(L, 1);
        }
        if (!problem[0] && n == 0) snprintf(problem, capacity, "field 'breaks_with': expected at least one fault name");
    }
    lua_pop(L, 1);
    return set;
}

// What lab.check{} says about its claim, copied out of the table: the
// lesson's measure() runs later and may empty the table and collect its strings.
typedef struct claim_fields {
    char id[sizeof ((lab_declared_claim*)0)->id];
    char claim[LESSON_MAX_CLAIM_BYTES + 1];
    char note[LESSON_MAX_CLAIM_BYTES + 1];
    bool expected;    // bank_answer, or expected for a claim beyond the bank
    bool beyond_bank; // the id is not in the bank (lesson_bank_claim_find)
} claim_fields;

// API 2's way to state a claim beyond the bank, `beyond_bank = true, answer
// = X`, still reads as API 3's `expected = X`, with one warning per lesson
// (lessons/README.md, "Changelog"). Sets *expected_type and *expected when
// the old fields are there.
static void read_old_beyond_bank(lua_State* L, const lesson_bank_claim* bank, int* expected_type, bool* expected) {
    int beyond_type = lab_get_field(L, 1, "beyond_bank");
    bool beyond = lua_toboolean(L, -1);
    lua_pop(L, 1);
    int answer_type = lab_get_field(L, 1, "answer");
    bool answer = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (beyond_type == LUA_TNIL && answer_type == LUA_TNIL) return;
    if (bank)
        lab_field_error(L, 1, beyond_type != LUA_TNIL ? "beyond_bank" : "answer",
                        "'%s' is a claim of the question bank: give bank_answer = %s (what the bank says)",
                        bank->id, bank->bank_answer ? "true" : "false");
    if (*expected_type != LUA_TNIL)
        lab_field_error(L, 1, beyond_type != LUA_TNIL ? "beyond_bank" : "answer",
                        "give expected = true or false alone (beyond_bank and answer are its old spelling)");
    if (beyond_type != LUA_TBOOLEAN || !beyond || answer_type != LUA_TBOOLEAN)
        lab_field_error(L, 1, beyond_type != LUA_TBOOLEAN || !beyond ? "beyond_bank" : "answer",
                        "the old spelling is beyond_bank = true, answer = true or false; write expected = true or "
                        "false instead");
    *expected_type = LUA_TBOOLEAN;
    *expected = answer;
    char message[300];
    snprintf(message, sizeof message,
             "lab.check's beyond_bank = true, answer = %s became expected = %s in lab API 3 (this is API %d); the old "
             "fields still work, but write expected (lessons/README.md, \"Changelog\")",
             answer ? "true" : "false", answer ? "true" : "false", LAB_API_VERSION);
    lab_warn_once(L, "lab.check beyond_bank", message);
}

// Reads id, claim, bank_answer or expected, and note of the
// table at argument 1, raising an argument error for a malformed one.
static void read_claim_fields(lua_State* L, claim_fields* out) {
    const char* given_id = lab_opt_string_field(L, 1, "id", NULL);
    if (!given_id) lab_field_error(L, 1, "id", "expected the claim id as a string (\"tf1\", \"se3\", ...)");
    if (!valid_claim_id(given_id))
        lab_field_error(L, 1, "id", "'%s' is not a claim id (lowercase letters, digits, '-', '_'; at most 15)", given_id);
    snprintf(out->id, sizeof out->id, "%s", given_id);
    const char* given_claim = lab_opt_string_field(L, 1, "claim", NULL);
    if (!given_claim) lab_field_error(L, 1, "claim", "expected the claim in words");
    if (strlen(given_claim) > LESSON_MAX_CLAIM_BYTES)
        lab_field_error(L, 1, "claim", "%zu bytes is too long (at most %d)", strlen(given_claim), LESSON_MAX_CLAIM_BYTES);
    snprintf(out->claim, sizeof out->claim, "%s", given_claim);
    // The bank's answer is the bank's, not the lesson's to give: a lesson
    // that declared tf10 with bank_answer = true and measured nothing once
    // printed a PASS. So bank_answer must match the bank, and a claim the
    // bank does not make says what the lesson expects in its own field.
    const lesson_bank_claim* bank = lesson_bank_claim_find(out->id);
    int bank_type = lab_get_field(L, 1, "bank_answer");
    bool bank_answer = lua_toboolean(L, -1);
    lua_pop(L, 1);
    int expected_type = lab_get_field(L, 1, "expected");
    bool expected = lua_toboolean(L, -1);
    lua_pop(L, 1);
    read_old_beyond_bank(L, bank, &expected_type, &expected);
    if (bank) {
        const char* says = bank->bank_answer ? "true" : "false";
        if (expected_type != LUA_TNIL)
            lab_field_error(L, 1, "expected",
                            "'%s' is a claim of the question bank: give bank_answer = %s (what the "
                            "bank says) instead",
                            out->id, says);
        if (bank_type != LUA_TBOOLEAN)
            lab_field_error(L, 1, "bank_answer",
                            "expected true or false (what the question bank says of '%s': %s), got %s", out->id, says,
                            lua_typename(L, bank_type));
        if (bank_answer != bank->bank_answer)
            lab_field_error(L, 1, "bank_answer", "the question bank says '%s' is %s (\"%s\"), not %s", out->id, says,
                            bank->statement, bank_answer ? "true" : "false");
        out->expected = bank_answer;
        out->beyond_bank = false;
    } else {
        if (bank_type != LUA_TNIL)
            lab_field_error(L, 1, "bank_answer",
                            "'%s' is not a claim of the question bank (tf1-tf10, se1-se8, why1-why6, "
                            "edge1-edge8, recall1); for a claim of your own give expected = true or false",
                            out->id);
        if (expected_type != LUA_TBOOLEAN)
            lab_field_error(L, 1, "expected",
                            "expected true or false (what the lesson expects of its own claim '%s', "
                            "which the question bank does not make), got %s",
                            out->id, lua_typename(L, expected_type));
        out->expected = expected;
        out->beyond_bank = true;
    }
    const char* given_note = lab_opt_string_field(L, 1, "note", "");
    if (strlen(given_note) > LESSON_MAX_CLAIM_BYTES)
        lab_field_error(L, 1, "note", "%zu bytes is too long (at most %d)", strlen(given_note), LESSON_MAX_CLAIM_BYTES);
    snprintf(out->note, sizeof out->note, "%s", given_note);
}

// With the measure field on top (of type measure_type), leaves the verdict
// and the evidence on the stack: measure()'s two results, or the verdict
// and evidence fields. Writes `problem` when measure fails (the time limit
// is re-raised: it is not a check's failure).
static void push_verdict(lua_State* L, lesson* l, int measure_type, char* problem, size_t capacity) {
    if (measure_type == LUA_TNIL) {
        lab_get_field(L, 1, "verdict");
        lab_get_field(L, 1, "evidence");
        return;
    }
    if (measure_type != LUA_TFUNCTION) {
        snprintf(problem, capacity, "field 'measure': expected a function, got %s", luaL_typename(L, -1));
        return;
    }
    lua_pushvalue(L, -1);
    if (lua_pcall(L, 0, 2, 0) != LUA_OK) {
        if (l->time_exceeded) lua_error(L);
        snprintf(problem, capacity, "measure failed: %s",
                 lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)");
    }
}

int lab_check(lua_State* L) {
    // beyond_bank and answer: API 2's spelling of expected (read_old_beyond_bank).
    static const char* const fields[] = {"id",       "claim",   "bank_answer", "expected", "verdict",  "evidence",
                                         "measure",  "breaks_with", "note",   "beyond_bank", "answer", NULL};
    lab_check_fields(L, 1, fields);
    lesson* l = lesson_of(L);
    claim_fields c;
    read_claim_fields(L, &c);
    lesson_check_result result = {c.id, c.claim, c.expected, false, "", CHECK_FAIL, 0, c.note, 0, c.beyond_bank};
    char problem[600] = "";
    result.breaks_with = read_breaks_with(L, problem, sizeof problem);
    lab_declared_claim* declared = find_declared(l, c.id);
    if (!problem[0] && l->declaration_seen && !declared)
        snprintf(problem, sizeof problem, "claim '%s' is not declared in lab.lesson{claims = {...}}", c.id);
    else if (!problem[0] && declared && declared->checked)
        snprintf(problem, sizeof problem, "claim '%s' was already checked in this lesson", c.id);
    if (declared) declared->checked = true;

    int measure_type = lab_get_field(L, 1, "measure");
    int base = lua_gettop(L);
    if (!problem[0]) push_verdict(L, l, measure_type, problem, sizeof problem);
    if (!problem[0]) {
        bool undecided = lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), LESSON_UNDECIDED_VERDICT) == 0;
        if (undecided && lua_type(L, -1) == LUA_TSTRING) {
            result.evidence = lua_tostring(L, -1);
            result.outcome = CHECK_UNDECIDED;
        } else if (lua_type(L, -2) != LUA_TBOOLEAN && !undecided)
            snprintf(problem, sizeof problem,
                     "verdict: expected a boolean computed from measurements (or lab.UNDECIDED), got %s",
                     luaL_typename(L, -2));
        else if (lua_type(L, -1) != LUA_TSTRING)
            snprintf(problem, sizeof problem, "evidence: expected a string with the measured numbers, got %s",
                     luaL_typename(L, -1));
        else {
            result.verdict = lua_toboolean(L, -2);
            result.evidence = lua_tostring(L, -1);
            result.outcome = result.verdict == c.expected ? CHECK_PASS : CHECK_DISAGREE;
        }
    }
    if (result.outcome == CHECK_FAIL) result.evidence = problem;
    report_check(l, &result);
    lua_settop(L, base);
    return 0;
}

// A unique address: the error value that stops a lesson right after its
// declaration when only its metadata is wanted.
static const char DECLARATION_ONLY = 0;

// lab.lesson{title = "...", claims = {"tf1", ...}}: the declaration. The
// claims are read raw into a local list and copied into the lesson only
// when all are good: an __index on the claims table once re-entered
// lab.lesson{} from the loop, the inner call filled the 64 places and the
// outer wrote past them. Re-entry is refused besides (l->declaring), though
// raw reads leave no way back into Lua between setting and clearing it.
int lab_declare_lesson(lua_State* L) {
    static const char* const fields[] = {"title", "claims", NULL};
    lesson* l = lesson_of(L);
    if (l->declaring)
        return lab_error(L, "lab.lesson{} called again while it runs (from the lesson's own metamethod?)");
    lab_check_fields(L, 1, fields);
    if (l->declaration_seen) lab_error(L, "lab.lesson{} may be called once");
    const char* title = lab_opt_string_field(L, 1, "title", NULL);
    if (!title) lab_field_error(L, 1, "title", "expected the lesson's title");
    enum { MAX_CLAIMS = sizeof l->declared / sizeof l->declared[0] };
    if (lab_get_field(L, 1, "claims") != LUA_TTABLE) lab_field_error(L, 1, "claims", "expected an array of claim ids");
    int claims = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, claims);
    if (n < 1 || n > MAX_CLAIMS)
        lab_field_error(L, 1, "claims", "expected 1..%d claim ids, got %lld", (int)MAX_CLAIMS, (long long)n);
    lab_declared_claim declared[MAX_CLAIMS];
    char problem[200] = "";
    l->declaring = true;
    for (int i = 0; i < (int)n && !problem[0]; i++) {
        const char* id = lua_rawgeti(L, claims, i + 1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (!id || !valid_claim_id(id))
            snprintf(problem, sizeof problem, "element %d: expected a claim id such as \"tf1\"", i + 1);
        for (int k = 0; k < i && !problem[0]; k++)
            if (strcmp(declared[k].id, id) == 0) snprintf(problem, sizeof problem, "'%s' is declared twice", id);
        if (!problem[0]) snprintf(declared[i].id, sizeof declared[i].id, "%s", id);
        declared[i].checked = false;
        lua_pop(L, 1);
    }
    l->declaring = false;
    if (problem[0]) lab_field_error(L, 1, "claims", "%s", problem);
    lesson_clean_text(title, l->title, sizeof l->title, false);
    memcpy(l->declared, declared, (size_t)n * sizeof *declared);
    l->n_declared = (int)n;
    l->declaration_seen = true;
    if (l->options.only_claim && !find_declared(l, l->options.only_claim)) {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        for (int i = 0; i < l->n_declared; i++) {
            if (i) luaL_addstring(&b, ", ");
            luaL_addstring(&b, l->declared[i].id);
        }
        luaL_pushresult(&b);
        lab_error(L, "--only %s: this lesson does not declare that claim (it declares: %s)", l->options.only_claim,
                  lua_tostring(L, -1));
    }
    if (l->info_only) {
        lua_pushlightuserdata(L, (void*)&DECLARATION_ONLY);
        return lua_error(L);
    }
    return 0;
}

bool lesson_stopped_at_declaration(lua_State* L) { return lua_touserdata(L, -1) == (void*)&DECLARATION_ONLY; }

void lesson_report_unchecked(lesson* l) {
    for (int i = 0; i < l->n_declared; i++) {
        if (l->declared[i].checked) continue;
        char evidence[1200];
        snprintf(evidence, sizeof evidence, "never checked: %s",
                 l->status == LESSON_FAILED ? l->error : "the lesson ended before lab.check for it");
        // A bank claim shows the bank's sentence and answer; the lesson's
        // own claim was never stated (its lab.check did not run).
        const lesson_bank_claim* bank = lesson_bank_claim_find(l->declared[i].id);
        lesson_check_result result = {l->declared[i].id,
                                      bank ? bank->statement : "(the lesson's own claim: its lab.check never ran)",
                                      bank && bank->bank_answer,
                                      false,
                                      evidence,
                                      CHECK_FAIL,
                                      0,
                                      "",
                                      0,
                                      !bank};
        report_check(l, &result);
    }
}
