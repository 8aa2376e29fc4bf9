// lesson sandbox: what a lesson's Lua may reach (lab/lesson/lesson.h lists it),
// and the one way it reaches files.
//
// Lessons are shared between people, so the sandbox is a security
// boundary. Files are opened beneath a folder descriptor one component at
// a time with O_NOFOLLOW: a link, dangling or not, is never followed, so no
// name a lesson writes (or a file its bundle ships) can lead outside the
// lesson's folder (reads) or the output folder (writes). Only regular files
// open, and they open with O_NONBLOCK first, so a FIFO cannot block the
// host. Text a lesson shows (narration, claims, evidence, errors) has its
// control characters made visible, so it cannot drive the terminal.
#include <errno.h>
#include <fcntl.h>
#include <lualib.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lab/lesson/internal.h"

bool lesson_path_inside(const char* path, const char* dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

// ---- text a lesson shows ------------------------------------------------------------------

size_t lesson_clean_text(const char* text, char* out, size_t capacity, bool multiline) {
    size_t n = 0;
    if (capacity == 0) return 0;
    for (const unsigned char* c = (const unsigned char*)text; *c && n + 1 < capacity; c++) {
        bool kept_space = multiline && (*c == '\n' || *c == '\t');
        if ((*c < 0x20 && !kept_space) || *c == 0x7f) {
            // Caret notation (ESC is ^[), as `cat -v` shows it: visible, inert.
            if (n + 2 >= capacity) break;
            out[n++] = '^';
            out[n++] = (char)(*c == 0x7f ? '?' : *c + 0x40);
        } else if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) {
            // U+0080..U+009F: the C1 controls (U+009B is a one-byte CSI to some terminals).
            out[n++] = '?';
            c++;
        } else {
            out[n++] = (char)*c;
        }
    }
    out[n] = '\0';
    return n;
}

char* lesson_clean_copy(const char* text, bool multiline) {
    size_t capacity = 2 * strlen(text) + 1; // every byte may become two
    char* out = malloc(capacity);
    if (out) lesson_clean_text(text, out, capacity, multiline);
    return out;
}

// ---- opening files beneath a folder --------------------------------------------------------

// Parses a Lua io mode ("r", "w", "a", "r+", "w+", "a+", each optionally with
// "b") into open(2) flags; -1 when it is not one.
static int open_flags_for_mode(const char* mode, bool* write) {
    int flags;
    switch (mode[0]) {
    case 'r': flags = O_RDONLY; break;
    case 'w': flags = O_WRONLY | O_CREAT | O_TRUNC; break;
    case 'a': flags = O_WRONLY | O_CREAT | O_APPEND; break;
    default: return -1;
    }
    const char* rest = mode + 1;
    if (*rest == '+') {
        flags = (flags & ~O_ACCMODE) | O_RDWR;
        rest++;
    }
    while (*rest == 'b') rest++;
    if (*rest) return -1;
    *write = mode[0] != 'r' || mode[1] == '+';
    return flags;
}

// Copies `name` into path (path_size bytes) relative to the folder: an
// absolute name must spell out the folder `base` itself, and no component
// may be '..'. Returns 0, or -1 with a reason in `problem`.
static int name_beneath(const char* base, const char* folder_name, const char* name, char* path, size_t path_size,
                        char* problem, size_t capacity) {
    size_t base_length = strlen(base);
    if (name[0] == '/') { // an absolute name must spell out the folder itself
        if (strncmp(name, base, base_length) != 0 || name[base_length] != '/') {
            snprintf(problem, capacity, "is outside the %s", folder_name);
            return -1;
        }
        name += base_length + 1;
    }
    if (snprintf(path, path_size, "%s", name) >= (int)path_size) {
        snprintf(problem, capacity, "has too long a name");
        return -1;
    }
    for (const char* c = path; *c; c = strchr(c, '/') ? strchr(c, '/') + 1 : c + strlen(c))
        if (strncmp(c, "..", 2) == 0 && (c[2] == '/' || c[2] == '\0')) {
            snprintf(problem, capacity, "is outside the %s ('..' is not allowed)", folder_name);
            return -1;
        }
    return 0;
}

// Says why openat of `component` inside dir_fd failed with open_errno: a
// symbolic link, a component that is not a folder, or another error (kept in
// error_number).
static void describe_refused_component(int dir_fd, const char* component, bool last, int open_errno,
                                       char* problem, size_t capacity, int* error_number) {
    if (open_errno == ELOOP || (!last && open_errno == ENOTDIR)) {
        struct stat st;
        bool is_link = fstatat(dir_fd, component, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
        if (is_link && last) snprintf(problem, capacity, "is a symbolic link, and lessons never follow links");
        else if (is_link) snprintf(problem, capacity, "passes through the symbolic link '%.200s', and lessons never "
                                                      "follow links", component);
        else snprintf(problem, capacity, "passes through '%.200s', which is not a folder", component);
    } else {
        *error_number = open_errno;
        snprintf(problem, capacity, "cannot be opened: %s", strerror(open_errno));
    }
}

// The checks on the opened file itself, then the O_TRUNC that openat was
// not given and blocking mode back. Returns 0, or -1 with a reason in
// `problem` (the caller closes file_fd).
static int accept_opened_file(int file_fd, int flags, char* problem, size_t capacity) {
    struct stat st;
    if (fstat(file_fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(problem, capacity, "is not a regular file");
        return -1;
    }
    if ((flags & O_ACCMODE) != O_RDONLY && st.st_nlink > 1) {
        // A hard link shipped in a bundle would reach a file elsewhere.
        snprintf(problem, capacity, "has other hard links; lessons write only to their own files");
        return -1;
    }
    if ((flags & O_TRUNC) && ftruncate(file_fd, 0) != 0) {
        snprintf(problem, capacity, "cannot be emptied: %s", strerror(errno));
        return -1;
    }
    int status = fcntl(file_fd, F_GETFL);
    if (status >= 0) fcntl(file_fd, F_SETFL, status & ~O_NONBLOCK);
    return 0;
}

// Opens `name` (relative to the folder `base_fd`, whose absolute path is
// `base`, called `folder_name` in messages) without following any link. Returns a descriptor, or -1 with a
// reason in `problem`. A file that does not exist yet is created only
// when may_create (the file quota); *created says whether it was.
static int open_beneath(int base_fd, const char* base, const char* folder_name, const char* name, int flags,
                        bool may_create, bool* created, char* problem, size_t capacity, int* error_number) {
    *error_number = 0;
    *created = false;
    char path[4096];
    if (name_beneath(base, folder_name, name, path, sizeof path, problem, capacity)) return -1;
    int dir_fd = dup(base_fd);
    if (dir_fd < 0) {
        snprintf(problem, capacity, "cannot be opened: %s", strerror(errno));
        return -1;
    }
    // One component at a time, each opened inside the folder before it.
    char* component = path;
    for (;;) {
        char* slash = strchr(component, '/');
        if (slash) *slash = '\0';
        bool last = slash == NULL;
        if (component[0] == '\0' || strcmp(component, ".") == 0) {
            if (last) {
                snprintf(problem, capacity, "names a folder, not a file");
                break;
            }
            component = slash + 1;
            continue;
        }
        struct stat existing;
        bool creates = last && (flags & O_CREAT) && fstatat(dir_fd, component, &existing, AT_SYMLINK_NOFOLLOW) != 0;
        if (creates && !may_create) {
            snprintf(problem, capacity, "would be a new file past the lesson's quota of files");
            *error_number = EDQUOT;
            break;
        }
        // O_TRUNC waits until the file has passed the checks below (a
        // hard link's other name must not be emptied by the refused open).
        int next = last ? openat(dir_fd, component, (flags & ~O_TRUNC) | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644)
                        : openat(dir_fd, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            describe_refused_component(dir_fd, component, last, errno, problem, capacity, error_number);
            break;
        }
        close(dir_fd);
        dir_fd = next;
        if (last) {
            if (accept_opened_file(dir_fd, flags, problem, capacity)) break;
            *created = creates;
            return dir_fd;
        }
        component = slash + 1;
    }
    close(dir_fd);
    return -1;
}

// Creates the output folder on first use and opens it; refuses a link.
static int output_folder_fd(lua_State* L) {
    lesson* l = lesson_of(L);
    if (l->output_fd >= 0) return l->output_fd;
    if (mkdir(l->output_dir, 0755) != 0 && errno != EEXIST)
        lab_error(L, "io.open: cannot create the output folder '%s': %s", l->output_dir, strerror(errno));
    int fd = open(l->output_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int reason = errno;
        struct stat st;
        bool is_link = lstat(l->output_dir, &st) == 0 && S_ISLNK(st.st_mode);
        lab_error(L, "io.open: the output folder '%s' %s", l->output_dir,
                  is_link ? "is a symbolic link; lessons write only into a real folder (give one with --output)"
                          : strerror(reason));
    }
    char resolved[PATH_MAX];
    if (!realpath(l->output_dir, resolved)) {
        close(fd);
        lab_error(L, "io.open: the output folder '%s': %s", l->output_dir, strerror(errno));
    }
    if (strlen(resolved) >= sizeof l->output_dir) {
        close(fd);
        lab_error(L, "io.open: the output folder's path is longer than %zu bytes", sizeof l->output_dir - 1);
    }
    memcpy(l->output_dir, resolved, strlen(resolved) + 1);
    l->output_fd = fd;
    return fd;
}

static int lesson_folder_fd(lua_State* L) {
    lesson* l = lesson_of(L);
    if (l->lesson_fd >= 0) return l->lesson_fd;
    l->lesson_fd = open(l->lesson_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (l->lesson_fd < 0) lab_error(L, "cannot open the lesson's folder '%s': %s", l->lesson_dir, strerror(errno));
    return l->lesson_fd;
}

// Opens a lesson's file as a stdio stream, raising a Lua error that names
// the file and what was wrong; a file to read that does not exist gives
// NULL instead when missing_ok (io.open's nil, message).
static FILE* sandbox_fopen(lua_State* L, const char* function, const char* name, const char* mode, bool missing_ok) {
    bool write = false;
    int flags = open_flags_for_mode(mode, &write);
    if (flags < 0) lab_error(L, "%s: '%s' is not a file mode (r, w, a, r+, w+, a+, optionally with b)", function, mode);
    lesson* l = lesson_of(L);
    if (l->n_open_files >= LESSON_MAX_OPEN_FILES)
        lab_error(L, "%s: '%s': a lesson may keep at most %d files open", function, name, LESSON_MAX_OPEN_FILES);
    int base_fd = write ? output_folder_fd(L) : lesson_folder_fd(L);
    const char* base = write ? l->output_dir : l->lesson_dir;
    char problem[300] = "";
    int error_number = 0;
    bool may_create = l->files_created < l->options.write_limit_files, created = false;
    int fd = open_beneath(base_fd, base, write ? "output folder" : "lesson's folder", name, flags, may_create,
                          &created, problem, sizeof problem, &error_number);
    if (fd < 0 && missing_ok && !write && error_number == ENOENT) return NULL;
    if (fd < 0 && error_number == EDQUOT)
        lab_error(L, "%s: '%s': write quota of %d files reached (--write-files): the lesson created %d", function,
                  name, l->options.write_limit_files, l->files_created);
    l->files_created += created;
    if (fd < 0)
        lab_error(L, "%s: '%s' %s (lessons read only inside their own folder '%s' and write only inside the output "
                     "folder '%s')",
                  function, name, problem, l->lesson_dir, l->output_dir);
    FILE* f = fdopen(fd, mode);
    if (!f) {
        close(fd);
        lab_error(L, "%s: '%s': %s", function, name, strerror(errno));
    }
    l->open_files[l->n_open_files++] = f;
    return f;
}

static void forget_file(lesson* l, FILE* f) {
    for (int i = 0; i < l->n_open_files; i++)
        if (l->open_files[i] == f) {
            l->open_files[i] = l->open_files[--l->n_open_files];
            return;
        }
}

// The close function of a lesson's file handle (liolib calls it once).
static int sandbox_file_close(lua_State* L) {
    luaL_Stream* stream = luaL_checkudata(L, 1, LUA_FILEHANDLE);
    forget_file(lesson_of(L), stream->f);
    int closed = fclose(stream->f) == 0;
    return luaL_fileresult(L, closed, NULL);
}

// file:write(...), counted against the write quota before it writes. A
// number counts as 32 bytes, more than "%.14g" or an integer prints.
static int sandbox_file_write(lua_State* L) {
    lesson* l = lesson_of(L);
    uint64_t bytes = 0;
    for (int i = 2; i <= lua_gettop(L); i++) bytes += lua_type(L, i) == LUA_TSTRING ? lua_rawlen(L, i) : 32;
    uint64_t limit = l->options.write_limit_bytes;
    if (bytes > limit - (l->written_bytes < limit ? l->written_bytes : limit))
        lab_error(L, "write quota of %.1f MiB reached (--write-limit): the lesson wrote %.1f MiB and asked for %.1f "
                     "MiB more", (double)limit / 1048576.0, (double)l->written_bytes / 1048576.0,
                  (double)bytes / 1048576.0);
    l->written_bytes += bytes;
    lua_pushvalue(L, lua_upvalueindex(1)); // liolib's write
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

// Pushes a Lua file handle (the io library's own type) owning f.
static void push_file_handle(lua_State* L, FILE* f) {
    luaL_Stream* stream = lua_newuserdatauv(L, sizeof *stream, 0);
    stream->closef = NULL; // not yet a valid handle, should the metatable fail
    luaL_setmetatable(L, LUA_FILEHANDLE);
    stream->f = f;
    stream->closef = sandbox_file_close;
}

void lesson_close_files(lesson* l) {
    while (l->n_open_files > 0) fclose(l->open_files[--l->n_open_files]);
    if (l->output_fd >= 0) close(l->output_fd);
    if (l->lesson_fd >= 0) close(l->lesson_fd);
    l->output_fd = l->lesson_fd = -1;
}

// io.open(name [, mode]): reads beneath the lesson's folder, writes beneath
// the output folder.
static int sandbox_io_open(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    const char* mode = luaL_optstring(L, 2, "r");
    // Lua's io.open reports a missing file as nil, message (not an error);
    // lessons written for it keep working.
    FILE* f = sandbox_fopen(L, "io.open", name, mode, true);
    if (!f) {
        luaL_pushfail(L);
        lua_pushfstring(L, "%s: No such file or directory", name);
        lua_pushinteger(L, ENOENT);
        return 3;
    }
    push_file_handle(L, f);
    return 1;
}

// io.lines(name, ...): the lines (or formats) of a file in the lesson's
// folder; the generic for closes the file (the fourth value) when it ends.
static int sandbox_io_lines(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    int n_formats = lua_gettop(L) - 1;
    push_file_handle(L, sandbox_fopen(L, "io.lines", name, "r", false));
    int file = lua_gettop(L);
    luaL_getmetafield(L, file, "__index");
    lua_getfield(L, -1, "lines");
    lua_remove(L, -2);
    lua_pushvalue(L, file);
    for (int i = 0; i < n_formats; i++) lua_pushvalue(L, 2 + i);
    lua_call(L, 1 + n_formats, 1); // file:lines(...)
    lua_pushnil(L);
    lua_pushnil(L);
    lua_pushvalue(L, file);
    return 4;
}

// load(chunk [, name [, mode [, env]]]): text chunks only.
static int sandbox_load(lua_State* L) {
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1)); // the real load
    lua_pushvalue(L, 1);
    if (n >= 2) lua_pushvalue(L, 2);
    else lua_pushnil(L);
    lua_pushliteral(L, "t");
    if (n >= 4) lua_pushvalue(L, 4);
    lua_call(L, n >= 4 ? 4 : 3, 2);
    return 2;
}

typedef struct file_reader {
    FILE* f;
    char buffer[4096];
} file_reader;

static const char* read_chunk(lua_State* L, void* user, size_t* size) {
    (void)L;
    file_reader* r = user;
    *size = fread(r->buffer, 1, sizeof r->buffer, r->f);
    return *size ? r->buffer : NULL;
}

// require(name): a .lua file beneath the lesson's folder, run once.
static int sandbox_require(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    for (const char* c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.'))
            luaL_argerror(L, 1, "module names use letters, digits, '_', '-' and '.' only");
    if (name[0] == '.' || strstr(name, "..")) luaL_argerror(L, 1, "module names cannot start with '.' or hold '..'");
    lua_getfield(L, LUA_REGISTRYINDEX, "servelab.loaded");
    if (lua_getfield(L, -1, name) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    char relative[1024];
    size_t n = 0;
    for (const char* c = name; *c && n + 5 < sizeof relative; c++) relative[n++] = *c == '.' ? '/' : *c;
    snprintf(relative + n, sizeof relative - n, ".lua");
    char function[300];
    snprintf(function, sizeof function, "require '%.200s'", name);
    FILE* f = sandbox_fopen(L, function, relative, "r", false);
    file_reader* reader = lua_newuserdatauv(L, sizeof *reader, 0); // freed with the stack, even on an error
    reader->f = f;
    lesson* l = lesson_of(L);
    lua_pushfstring(L, "@%s/%s", l->lesson_dir, relative);
    int status = lua_load(L, read_chunk, reader, lua_tostring(L, -1), "t");
    forget_file(l, f);
    fclose(f);
    if (status != LUA_OK)
        lab_error(L, "require '%s': %s (modules are .lua files in the lesson's folder)", name, lua_tostring(L, -1));
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -5, name); // servelab.loaded[name]
    return 1;
}

// print(...) is narration.
static int sandbox_print(lua_State* L) {
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    lesson_say(lesson_of(L), lua_tostring(L, -1));
    return 0;
}

// setmetatable(t, mt) without finalizers: Lua runs __gc with hooks off (at
// collection and at lua_close), where no time limit can reach it, so a
// lesson's metatable may not carry one. The host's own types keep theirs
// behind __metatable, which setmetatable and getmetatable respect.
static int sandbox_setmetatable(lua_State* L) {
    // A protected metatable (the lab's strict tables) is refused here, so
    // the error carries the lesson's line like every other.
    if (lua_type(L, 1) == LUA_TTABLE && luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
        return luaL_error(L, "cannot change a protected metatable");
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: __gc finalizers are not available to lessons (they would run "
                                 "where the time limit cannot stop them)");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1)); // the real setmetatable
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

// __index of the sandboxed io, os and package tables: names what is missing.
static int sandbox_missing(lua_State* L) {
    const char* library = lua_tostring(L, lua_upvalueindex(1));
    const char* allowed = lua_tostring(L, lua_upvalueindex(2));
    const char* key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?";
    return luaL_error(L, "%s.%s is not available to lessons (the sandbox allows %s)", library, key, allowed);
}

// Gives the table on top of the stack a metatable whose __index raises sandbox_missing.
static void forbid_missing(lua_State* L, const char* library, const char* allowed) {
    lua_newtable(L);
    lua_pushstring(L, library);
    lua_pushstring(L, allowed);
    lua_pushcclosure(L, sandbox_missing, 2);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
}

// Replaces global `name` by `wrapper`, given the original as upvalue 1.
static void wrap_global(lua_State* L, const char* name, lua_CFunction wrapper) {
    lua_getglobal(L, name);
    lua_pushcclosure(L, wrapper, 1);
    lua_setglobal(L, name);
}

void lesson_install_sandbox(lua_State* L) {
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    lua_pop(L, 1);
    static const struct {
        const char* name;
        lua_CFunction open;
    } safe[] = {{LUA_TABLIBNAME, luaopen_table},
                {LUA_STRLIBNAME, luaopen_string},
                {LUA_MATHLIBNAME, luaopen_math},
                {LUA_UTF8LIBNAME, luaopen_utf8},
                {LUA_COLIBNAME, luaopen_coroutine}};
    for (size_t i = 0; i < sizeof safe / sizeof safe[0]; i++) {
        luaL_requiref(L, safe[i].name, safe[i].open, 1);
        lua_pop(L, 1);
    }
    // Remove what reaches the file system or loads bytecode.
    static const char* const removed_globals[] = {"dofile", "loadfile", NULL};
    for (const char* const* g = removed_globals; *g; g++) {
        lua_pushnil(L);
        lua_setglobal(L, *g);
    }
    lua_getglobal(L, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    wrap_global(L, "load", sandbox_load);
    wrap_global(L, "setmetatable", sandbox_setmetatable);
    lua_pushcfunction(L, sandbox_print);
    lua_setglobal(L, "print");
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "servelab.loaded");
    lua_pushcfunction(L, sandbox_require);
    lua_setglobal(L, "require");

    // io: open and lines, through open_beneath; no popen, no standard
    // streams. The library is opened (hidden) for its file handle type.
    luaL_requiref(L, LUA_IOLIBNAME, luaopen_io, 0);
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushcfunction(L, sandbox_io_open);
    lua_setfield(L, -2, "open");
    lua_pushcfunction(L, sandbox_io_lines);
    lua_setfield(L, -2, "lines");
    forbid_missing(L, "io", "io.open and io.lines inside the lesson's folder, writes inside the output folder");
    lua_setglobal(L, "io");

    // os: the clock and the date only.
    luaL_requiref(L, LUA_OSLIBNAME, luaopen_os, 0);
    lua_newtable(L);
    static const char* const os_kept[] = {"time", "clock", "date", "difftime", NULL};
    for (const char* const* f = os_kept; *f; f++) {
        lua_getfield(L, -2, *f);
        lua_setfield(L, -2, *f);
    }
    forbid_missing(L, "os", "os.time, os.clock, os.date and os.difftime");
    lua_setglobal(L, "os");
    lua_pop(L, 1);
    lua_newtable(L); // no package library: require() is the lesson's own
    forbid_missing(L, "package", "require of .lua files from the lesson's folder");
    lua_setglobal(L, "package");
    // Forget the hidden libraries' registry entries, so nothing reaches them.
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_pushnil(L);
    lua_setfield(L, -2, LUA_IOLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, LUA_OSLIBNAME);
    lua_pop(L, 1);
    // The file handle type keeps its finalizer (it closes files) out of
    // reach, and its write method counts against the write quota.
    luaL_getmetatable(L, LUA_FILEHANDLE);
    lua_getfield(L, -1, "__index");
    lua_getfield(L, -1, "write");
    lua_pushcclosure(L, sandbox_file_write, 1);
    lua_setfield(L, -2, "write");
    lua_pop(L, 1);
    lua_pushliteral(L, "file handle");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
}
