#include "engine/stop_rule.h"

#include "engine/tokenizer.h"

const char* stop_reason_name(stop_reason reason) {
    switch (reason) {
    case STOP_LENGTH: return "length";
    case STOP_EOS: return "eos";
    case STOP_BOS: return "bos";
    case STOP_CONTEXT: return "context";
    case STOP_CANCELLED: return "cancelled";
    }
    return "?";
}

bool token_ends_sequence(const model* m, int32_t token, stop_reason* reason) {
    if (m->n_stop_tokens == 0) {
        if (token != TOK_EOS_ID && token != TOK_BOS_ID) return false;
        *reason = token == TOK_EOS_ID ? STOP_EOS : STOP_BOS;
        return true;
    }
    for (int i = 0; i < m->n_stop_tokens; i++)
        if (token == m->stop_tokens[i]) {
            *reason = STOP_EOS;
            return true;
        }
    return false;
}
