// quiz_units: numbers with units, and checking a typed answer against the
// expected one within a tolerance.
//
// Units: B (also "bytes"), KB/KiB, MB/MiB, GB/GiB, TB/TiB; % ; x ; ms, s,
// us. Decimal prefixes are powers of 1000 (1 GB = 10^9 B), binary ones
// powers of 1024 (1 GiB = 2^30 B). Letters are case-insensitive ("gib"
// is GiB); a number without a unit is read in the unit the question asks
// for. Numbers use '.' for decimals and may have an exponent (1.5e9);
// thousands separators are refused rather than guessed.
#ifndef SERVELAB_QUIZ_UNITS_H
#define SERVELAB_QUIZ_UNITS_H

#include <stdbool.h>

#include "base/error.h"

typedef enum quiz_dimension {
    QUIZ_DIM_NUMBER = 0, // a plain number (counts, codes, scales): no unit
    QUIZ_DIM_BYTES,      // base unit: byte
    QUIZ_DIM_PERCENT,    // base unit: %
    QUIZ_DIM_RATIO,      // base unit: x (times)
    QUIZ_DIM_TIME,       // base unit: ms
} quiz_dimension;

typedef struct quiz_quantity {
    double value;       // in the dimension's base unit (bytes, %, x, ms)
    double typed_value; // the number as typed
    quiz_dimension dim;
    bool has_unit; // false: a bare number
    char unit[8];  // the unit's canonical spelling ("GiB"), "" when bare
} quiz_quantity;

// Parses "12.5 GiB", "12.5gib", "1.5e9 B", "17x", "45 %", "3.2 ms", "-0.75".
// 0, or -1 with err saying what was wrong (no number, thousands separator,
// not finite, unknown unit).
int quiz_parse_quantity(const char* text, quiz_quantity* out, error_info* err);

// Base units per `unit` ("GiB" -> 2^30), with its dimension; -1 when unknown.
double quiz_unit_factor(const char* unit, quiz_dimension* dim);

// An expected numeric answer.
typedef struct quiz_numeric {
    double value; // base units
    quiz_dimension dim;
    char unit[8];         // the unit the question asks for ("GiB"; "" for plain numbers)
    double rel_tolerance; // 0.01 = 1%
    double abs_tolerance; // base units; the larger of the two tolerances applies
} quiz_numeric;

// value (base units) written in `unit` with 4 significant digits, plus the
// other byte family in brackets for sizes: "8.000 GiB (8.590 GB)".
void quiz_format_numeric(const quiz_numeric* n, char* out, int capacity);

typedef struct quiz_numeric_verdict {
    bool correct;
    bool unit_mixup; // wrong by exactly a decimal/binary prefix factor (GB vs GiB, ...)
    char feedback[1024];
} quiz_numeric_verdict;

// Grades `input` against `expected`. Returns 0 with *verdict filled, or -1
// with err when the input cannot be graded (not a number, unknown unit,
// wrong kind of unit): the caller asks again.
int quiz_check_numeric(const quiz_numeric* expected, const char* input, quiz_numeric_verdict* verdict, error_info* err);

#endif
