#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "tests/test_support.h"

#include "engine/engine.h"
#include "engine/model_storage.h"
#include "kernels/cpu/cpu_features.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bool file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool shared_model_path(char* out, size_t out_capacity, const char* name) {
    // The repository root is the working directory (scripts/run-tests.sh);
    // SERVELAB_SHARED overrides the location of shared/ for unusual layouts.
    // ./models is where `make models` puts stories260K.bin and tok512.bin
    // (the reference outputs exist only in shared/).
    const char* shared = getenv("SERVELAB_SHARED");
    int written = snprintf(out, out_capacity, "%s/models/%s", shared ? shared : "../shared", name);
    if (written < 0 || (size_t)written >= out_capacity) return false;
    if (file_exists(out)) return true;
    written = snprintf(out, out_capacity, "models/%s", name);
    return written >= 0 && (size_t)written < out_capacity && file_exists(out);
}

void test_report_missing_shared(const char* name) {
    if (getenv("CI")) fail_msg("../shared/models/%s is missing and CI is set", name);
    static bool said;
    if (!said)
        print_message("skipping the tests that need llama2.c's or llama.cpp's own files: %s is in neither "
                      "../shared/models (beside the clone) nor ./models; 'make models' fetches stories260K.bin "
                      "and tok512.bin (the reference outputs come only with ../shared)\n",
                      name);
    else
        print_message("skipping: %s is missing (see above)\n", name);
    said = true;
}

const char* test_scratch_dir(void) {
    static char dir[256];
    if (dir[0] == '\0') {
        mkdir("build", 0755);
        mkdir("build/test-tmp", 0755);
        snprintf(dir, sizeof dir, "build/test-tmp/%ld", (long)getpid());
        mkdir(dir, 0755);
    }
    return dir;
}

unsigned char* test_read_file(const char* path, size_t* out_size) {
    FILE* file = fopen(path, "rb");
    if (!file) return NULL;
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    unsigned char* bytes = malloc(size > 0 ? (size_t)size : 1);
    if (bytes && size > 0 && fread(bytes, 1, (size_t)size, file) != (size_t)size) {
        free(bytes);
        bytes = NULL;
    }
    fclose(file);
    if (bytes && out_size) *out_size = (size_t)size;
    return bytes;
}

bool test_write_file(const char* path, const void* bytes, size_t size) {
    FILE* file = fopen(path, "wb");
    if (!file) return false;
    bool ok = size == 0 || fwrite(bytes, 1, size, file) == size;
    return fclose(file) == 0 && ok;
}

char* test_read_text(const char* path) {
    size_t size = 0;
    unsigned char* bytes = test_read_file(path, &size);
    if (!bytes) size = 0;
    char* text = realloc(bytes, size + 1);
    if (text) text[size] = '\0';
    return text;
}

bool test_simd_level_available(int level) {
    if ((int)cpu_features_get()->best >= level) return true;
    if (getenv("CI")) fail_msg("CI is set but this CPU lacks SIMD level %s", cpu_simd_level_name((cpu_simd_level)level));
    print_message("skipping level %s: this CPU lacks it\n", cpu_simd_level_name((cpu_simd_level)level));
    return false;
}

const char* test_servelab_binary(void) {
    const char* bin = getenv("SERVELAB_BIN");
    return bin && bin[0] ? bin : "bin/servelab";
}

command_result run_servelab(const char* arguments) {
    char out_path[512], err_path[512], command[4096];
    snprintf(out_path, sizeof out_path, "%s/cli.out", test_scratch_dir());
    snprintf(err_path, sizeof err_path, "%s/cli.err", test_scratch_dir());
    snprintf(command, sizeof command, "%s %s >%s 2>%s </dev/null", test_servelab_binary(), arguments, out_path,
             err_path);
    int raw = system(command);
    command_result result = {-1, test_read_text(out_path), test_read_text(err_path)};
    // system() runs sh; a signal in the child shows as 128 + signal.
    if (raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) < 128) result.exit_status = WEXITSTATUS(raw);
    return result;
}

void free_result(command_result* result) {
    free(result->out);
    free(result->err);
}

void test_require_program(const char* program) {
    char command[300];
    snprintf(command, sizeof command, "command -v '%s' >/dev/null 2>&1", program);
    if (system(command) == 0) return;
    if (getenv("CI")) fail_msg("'%s' is not installed and CI is set (make test-deps installs it)", program);
    print_message("skipping: '%s' is not installed (make test-deps installs it)\n", program);
    skip();
}

void test_tmux_require(void) { test_require_program("tmux"); }

int test_tmux(const char* socket, const char* arguments) {
    char command[8192];
    snprintf(command, sizeof command, "tmux -L %s %s >/dev/null 2>&1", socket, arguments);
    return system(command);
}

char* test_tmux_output(const char* socket, const char* arguments) {
    char path[512], command[8192];
    snprintf(path, sizeof path, "%s/tmux-out.txt", test_scratch_dir());
    snprintf(command, sizeof command, "tmux -L %s %s >%s 2>/dev/null", socket, arguments, path);
    if (system(command) != 0) remove(path);
    return test_read_text(path);
}

void test_sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

char* test_tmux_wait_for_text(const char* socket, const char* target, const char* text, int timeout_ms) {
    char capture[256];
    snprintf(capture, sizeof capture, "capture-pane -p -t %s", target);
    for (int waited_ms = 0;; waited_ms += 100) {
        char* screen = test_tmux_output(socket, capture);
        if (strstr(screen, text)) return screen;
        if (waited_ms >= timeout_ms) fail_msg("the pane never showed '%s'; last capture:\n%s", text, screen);
        free(screen);
        test_sleep_ms(100);
    }
}

bool test_tmux_alternate_screen_on(const char* socket, const char* target) {
    char arguments[256];
    snprintf(arguments, sizeof arguments, "display-message -p -t %s '#{alternate_on}'", target);
    char* flag = test_tmux_output(socket, arguments);
    bool on = flag[0] == '1';
    free(flag);
    return on;
}

// The port after "127.0.0.1:" once a character other than a digit follows it; else 0.
static int port_in(const char* text) {
    const char* at = strstr(text, "127.0.0.1:");
    if (!at) return 0;
    const char* digits = at + strlen("127.0.0.1:");
    const char* end = digits;
    while (*end >= '0' && *end <= '9') end++;
    return end > digits && *end ? atoi(digits) : 0;
}

int test_spawn_until_port(const char* command, double timeout_s, int* pid, int* stdout_fd, char* line,
                          size_t line_capacity) {
    int out[2];
    line[0] = '\0';
    *pid = -1;
    if (stdout_fd) *stdout_fd = -1;
    if (pipe(out) != 0) return 0;
    pid_t child = fork();
    if (child < 0) {
        close(out[0]);
        close(out[1]);
        return 0;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); // a test that dies takes its server along
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl("/bin/sh", "sh", "-c", command, (char*)NULL);
        _exit(127);
    }
    close(out[1]);
    *pid = (int)child;
    size_t n = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int port = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
        if ((port = port_in(line)) > 0 || n + 1 >= line_capacity || elapsed > timeout_s) break;
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t got = read(out[0], line + n, line_capacity - 1 - n);
        if (got <= 0) break;
        n += (size_t)got;
        line[n] = '\0';
    }
    if (stdout_fd) *stdout_fd = out[0];
    else close(out[0]);
    return port;
}

test_generation test_engine_generate(const struct model* m, const int32_t* prompt_ids, int n_prompt,
                                     int max_new_tokens, float temperature, float top_p, uint64_t seed,
                                     int32_t* out_ids) {
    engine_config config = engine_config_default();
    config.kv_dtype = KV_F32;
    config.n_threads = 1; // the bits do not depend on it (test_engine), and tests share two cores
    config.num_blocks = (m->config.max_seq_len + config.block_size - 1) / config.block_size; // the longest sequence
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, m, &config, &err)) fail_msg("engine_init: %s", err.message);
    request_params request = {prompt_ids, n_prompt, max_new_tokens, 1, temperature, top_p, seed, 0.0, false};
    int32_t id = -1;
    if (engine_add_request(&e, &request, &id, &err)) fail_msg("engine_add_request: %s", err.message);
    test_generation result;
    memset(&result, 0, sizeof result);
    while (engine_has_work(&e)) {
        const step_record* record = NULL;
        if (engine_step(&e, &record, &err)) fail_msg("engine_step: %s", err.message);
        if (record->prefill_tokens == 0 && record->decode_tokens > 0) {
            result.n_decode_steps++;
            traffic_add(&result.decode_traffic, &record->traffic);
        }
    }
    const sequence* s = test_sequence(&e, id);
    result.n_generated = s->n_tokens - s->n_prompt;
    result.stop = (int)s->stop;
    memcpy(out_ids, s->tokens + s->n_prompt, (size_t)result.n_generated * sizeof *out_ids);
    engine_free(&e);
    return result;
}

const sequence* test_sequence(const engine* e, int32_t id) {
    const scheduler* s = &e->scheduler;
    return id >= 0 && id < s->n_sequences && s->sequences[id].tokens ? &s->sequences[id] : NULL;
}

// splitmix64, then Box-Muller: a normal deviate from a plain counter stream.
static double next_uniform(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0; // (0, 1)
}

static float next_normal(uint64_t* state) {
    double u = next_uniform(state), v = next_uniform(state);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

void test_synthesize_stories260k_shape(struct model* out) {
    model_config config = {.dim = 64,
                           .hidden_dim = 172,
                           .n_layers = 5,
                           .n_heads = 8,
                           .n_kv_heads = 4,
                           .vocab_size = 512,
                           .max_seq_len = 512,
                           .shared_classifier = true};
    error_info err = {{0}};
    memset(out, 0, sizeof *out);
    if (model_config_validate(&config, "stories260K-shaped", &err) ||
        model_storage_allocate(out, &config, WEIGHT_F32, 0, &err))
        fail_msg("stories260K's shape: %s", err.message);
    snprintf(out->name, sizeof out->name, "stories260K-shaped");
    uint64_t state = 260;
    float* embedding = (float*)out->token_embedding.values;
    for (size_t i = 0; i < (size_t)config.vocab_size * (size_t)config.dim; i++)
        embedding[i] = next_normal(&state) * 2.0f / sqrtf((float)config.dim);
    for (int l = 0; l < config.n_layers; l++) {
        for (int i = 0; i < config.dim; i++) {
            ((float*)out->layers[l].rms_attention)[i] = 1.0f;
            ((float*)out->layers[l].rms_ffn)[i] = 1.0f;
        }
        for (int k = 0; k < 7; k++) {
            const weight_matrix* w = model_storage_layer_matrix(&out->layers[l], k);
            float sigma = 1.0f / sqrtf((float)w->cols);
            for (size_t i = 0; i < (size_t)w->rows * (size_t)w->cols; i++)
                ((float*)w->values)[i] = next_normal(&state) * sigma;
        }
    }
    for (int i = 0; i < config.dim; i++)
        ((float*)out->rms_final)[i] = 1.0f;
    model_storage_build_tiles(out);
}
