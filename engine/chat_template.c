#include "engine/chat_template.h"

#include <string.h>

// ---- recognition -----------------------------------------------------------------------------

// Each family's template writes its markers as literal text; the first
// family whose markers all appear wins. Llama 3 before ChatML: some
// Llama 3 fine-tunes mention <|im_start|> nowhere, but ChatML templates
// never write <|start_header_id|>.
chat_template_kind chat_template_recognise(const char* text) {
    if (!text || !text[0]) return CHAT_TEMPLATE_NONE;
    if (strstr(text, "<|start_header_id|>") && strstr(text, "<|eot_id|>")) return CHAT_TEMPLATE_LLAMA3;
    if (strstr(text, "<|im_start|>")) return CHAT_TEMPLATE_CHATML;
    if (strstr(text, "[INST]")) return CHAT_TEMPLATE_LLAMA2;
    if (strstr(text, "<|user|>") && strstr(text, "<|assistant|>")) return CHAT_TEMPLATE_ZEPHYR;
    return CHAT_TEMPLATE_NONE;
}

const char* chat_template_name(chat_template_kind kind) {
    switch (kind) {
    case CHAT_TEMPLATE_LLAMA3: return "llama3";
    case CHAT_TEMPLATE_CHATML: return "chatml";
    case CHAT_TEMPLATE_LLAMA2: return "llama2";
    case CHAT_TEMPLATE_ZEPHYR: return "zephyr";
    default: return "none";
    }
}

// ---- writing ---------------------------------------------------------------------------------

typedef struct text_out {
    char* out;
    size_t capacity;
    size_t length; // the whole length, even past capacity
} text_out;

static void append(text_out* t, const char* text) {
    size_t n = strlen(text);
    if (t->length < t->capacity) {
        size_t room = t->capacity - t->length - 1; // leaves the NUL's byte
        memcpy(t->out + t->length, text, n < room ? n : room);
    }
    t->length += n;
}

static bool is_role(const chat_message* m, const char* role) { return m->role && strcmp(m->role, role) == 0; }

// Llama 2: the system text goes inside the first [INST], each answer
// closes its turn with </s> and the next turn opens with <s>[INST].
static int write_llama2(text_out* t, const chat_message* messages, int n, error_info* err) {
    const char* system = NULL;
    bool open_turn = false, first_user = true;
    for (int i = 0; i < n; i++) {
        const chat_message* m = &messages[i];
        if (is_role(m, "system")) {
            system = m->content;
        } else if (is_role(m, "user")) {
            append(t, first_user ? "[INST] " : "<s>[INST] ");
            if (system && first_user) {
                append(t, "<<SYS>>\n");
                append(t, system);
                append(t, "\n<</SYS>>\n\n");
            }
            append(t, m->content);
            append(t, " [/INST]");
            first_user = false;
            open_turn = true;
        } else if (is_role(m, "assistant")) {
            if (!open_turn) return error_set(err, "chat template llama2: message %d: an assistant turn needs a user turn before it", i);
            append(t, " ");
            append(t, m->content);
            append(t, " </s>");
            open_turn = false;
        } else {
            return error_set(err, "chat template llama2: message %d: role '%s', expected system, user or assistant", i,
                             m->role ? m->role : "(none)");
        }
    }
    return 0;
}

int chat_template_apply(chat_template_kind kind, const chat_message* messages, int n_messages,
                        bool add_generation_prompt, char* out, size_t capacity, size_t* needed, error_info* err) {
    text_out t = {out, capacity, 0};
    if (out && capacity > 0) out[0] = '\0';
    if (needed) *needed = 0;
    if (kind == CHAT_TEMPLATE_NONE) return error_set(err, "chat template: none recognised for this model");
    for (int i = 0; i < n_messages; i++)
        if (!messages[i].content || !messages[i].role)
            return error_set(err, "chat template: message %d has no role or content", i);
    if (kind == CHAT_TEMPLATE_LLAMA2) {
        if (write_llama2(&t, messages, n_messages, err)) return -1;
    } else {
        for (int i = 0; i < n_messages; i++) {
            const chat_message* m = &messages[i];
            if (!is_role(m, "system") && !is_role(m, "user") && !is_role(m, "assistant"))
                return error_set(err, "chat template %s: message %d: role '%s', expected system, user or assistant",
                                 chat_template_name(kind), i, m->role);
            if (kind == CHAT_TEMPLATE_LLAMA3) {
                append(&t, "<|start_header_id|>");
                append(&t, m->role);
                append(&t, "<|end_header_id|>\n\n");
                append(&t, m->content);
                append(&t, "<|eot_id|>");
            } else if (kind == CHAT_TEMPLATE_CHATML) {
                append(&t, "<|im_start|>");
                append(&t, m->role);
                append(&t, "\n");
                append(&t, m->content);
                append(&t, "<|im_end|>\n");
            } else { // Zephyr
                append(&t, "<|");
                append(&t, m->role);
                append(&t, "|>\n");
                append(&t, m->content);
                append(&t, "</s>\n");
            }
        }
        if (add_generation_prompt)
            append(&t, kind == CHAT_TEMPLATE_LLAMA3   ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                       : kind == CHAT_TEMPLATE_CHATML ? "<|im_start|>assistant\n"
                                                      : "<|assistant|>\n");
    }
    if (needed) *needed = t.length;
    if (out && capacity > 0) out[t.length < capacity ? t.length : capacity - 1] = '\0';
    if (t.length >= capacity)
        return error_set(err, "chat template %s: the prompt needs %zu bytes, %zu are free", chat_template_name(kind),
                         t.length + 1, capacity);
    return 0;
}
