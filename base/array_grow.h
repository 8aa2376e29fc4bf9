// array_grow: growing a heap array on demand, for arrays that are reused
// every step and only ever get larger (a step's rows, a record's tables).
#ifndef SERVELAB_ARRAY_GROW_H
#define SERVELAB_ARRAY_GROW_H

#include <stddef.h>

// Makes *array (a pointer to the array's pointer) hold at least n elements
// of `size` bytes, doubling its capacity so that a run of steps reallocates
// O(log n) times. *capacity is updated. -1 when out of memory (the array is
// left as it was).
int array_grow(void* array, int* capacity, int n, size_t size);

#endif
