#include "base/array_grow.h"

#include <stdlib.h>

int array_grow(void* array, int* capacity, int n, size_t size) {
    if (n <= *capacity) return 0;
    int wanted = n > 2 * *capacity ? n : 2 * *capacity;
    void* grown = realloc(*(void**)array, (size_t)wanted * size);
    if (!grown) return -1;
    *(void**)array = grown;
    *capacity = wanted;
    return 0;
}
