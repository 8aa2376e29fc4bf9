// json_out: the commands' shared JSON output (lab/common/json_out.h).
#include "lab/common/json_out.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab/serve/api.h" // serve_utf8_sanitize

json_t* json_out_text(const char* text) {
    char* clean = serve_utf8_sanitize(text, strlen(text));
    json_t* value = clean ? json_string(clean) : NULL;
    free(clean);
    return value;
}

json_t* json_out_rounded(double value, int decimals, int digits) {
    if (!isfinite(value)) return json_null();
    char text[512];
    if (digits > 0)
        snprintf(text, sizeof text, "%.*g", digits, value);
    else
        snprintf(text, sizeof text, "%.*f", decimals, value);
    return json_real(strtod(text, NULL));
}

json_t* json_out_whole(double value) {
    if (isfinite(value) && fabs(value) < 9e15) return json_integer((json_int_t)llround(value));
    return json_out_rounded(value, 0, 17);
}

void json_out_append(json_t** array, json_t* value) {
    if (*array && json_array_append_new(*array, value) == 0) return;
    if (!*array) json_decref(value);
    json_decref(*array);
    *array = NULL;
}

int json_out_print(json_t* root, size_t flags, const char* command) {
    char* text = root ? json_dumps(root, flags | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(root);
    if (!text) {
        fprintf(stderr, "servelab %s: out of memory writing the JSON\n", command);
        return 1;
    }
    bool written = fputs(text, stdout) >= 0 && putchar('\n') != EOF && fflush(stdout) == 0;
    free(text);
    if (!written) {
        fprintf(stderr, "servelab %s: cannot write the JSON to stdout\n", command);
        return 1;
    }
    return 0;
}
