#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

int error_set(error_info* err, const char* format, ...) {
    if (err) {
        va_list args;
        va_start(args, format);
        vsnprintf(err->message, sizeof err->message, format, args);
        va_end(args);
    }
    return -1;
}

void error_clear(error_info* err) {
    if (err) err->message[0] = '\0';
}
