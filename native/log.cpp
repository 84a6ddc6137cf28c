#include "log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "ggml.h"

namespace aural {

namespace {
std::atomic<int> g_level{static_cast<int>(log_level::warn)};
thread_local std::string * g_capture = nullptr;  // set by capture_ggml_warnings on its thread

const char * level_name(log_level level) {
    switch (level) {
        case log_level::debug: return "debug";
        case log_level::info: return "info";
        case log_level::warn: return "warning";
        case log_level::error: return "error";
    }
    return "?";
}

void ggml_sink(ggml_log_level level, const char * text, void * /*user*/) {
    int py = 20;
    switch (level) {
        case GGML_LOG_LEVEL_DEBUG: py = 10; break;
        case GGML_LOG_LEVEL_WARN: py = 30; break;
        case GGML_LOG_LEVEL_ERROR: py = 40; break;
        default: py = 20; break;  // INFO, CONT, NONE
    }
    if (g_capture && py >= static_cast<int>(log_level::warn)) {
        *g_capture += text;
    } else if (py >= g_level.load()) {
        std::fputs(text, stderr);
    }
}
}  // namespace

void set_log_level(int python_level) { g_level.store(python_level); }
int get_log_level() { return g_level.load(); }

void log_printf(log_level level, const char * func, const char * fmt, ...) {
    if (static_cast<int>(level) < g_level.load()) {
        return;
    }
    char buf[1024];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    std::fprintf(stderr, "aural.native %s: %s: %s\n", level_name(level), func, buf);
}

void install_ggml_log_sink() { ggml_log_set(ggml_sink, nullptr); }

std::string capture_ggml_warnings(const std::function<void()> & fn) {
    std::string captured;
    struct restore {
        ~restore() { g_capture = nullptr; }
    } guard;
    g_capture = &captured;
    fn();
    while (!captured.empty() && captured.back() == '\n') captured.pop_back();
    return captured;
}

}  // namespace aural
