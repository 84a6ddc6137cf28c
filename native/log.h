// One logging sink for the native engine and for ggml itself.
//
//   aural::set_log_level(30);                 // Python logging levels: 10 debug .. 40 error
//   AURAL_LOG_INFO("KV arena: %.2f MiB", mib); // every line carries __func__
//
// Thread-safety: the level is atomic; lines are written whole with one fprintf.
#pragma once

#include <functional>
#include <string>

namespace aural {

enum class log_level : int { debug = 10, info = 20, warn = 30, error = 40 };

// Levels follow Python's `logging` numbers so the bindings can pass them straight through.
void set_log_level(int python_level);
int get_log_level();
void log_printf(log_level level, const char * func, const char * fmt, ...) __attribute__((format(printf, 3, 4)));
// Routes ggml's own log lines through the same sink (ggml logs at warn/error for fallbacks and OOM).
void install_ggml_log_sink();
// Runs `fn` and returns ggml's warnings and errors from it, one per line, instead of printing them: while a GPU
// backend loads they say why it has no device or does not load, which the backend report shows (backend.h).
std::string capture_ggml_warnings(const std::function<void()> & fn);

}  // namespace aural

#define AURAL_LOG_DEBUG(...) ::aural::log_printf(::aural::log_level::debug, __func__, __VA_ARGS__)
#define AURAL_LOG_INFO(...)  ::aural::log_printf(::aural::log_level::info, __func__, __VA_ARGS__)
#define AURAL_LOG_WARN(...)  ::aural::log_printf(::aural::log_level::warn, __func__, __VA_ARGS__)
#define AURAL_LOG_ERROR(...) ::aural::log_printf(::aural::log_level::error, __func__, __VA_ARGS__)

// Invariants of our own code (not user input): throw, never abort the Python process.
#define AURAL_ASSERT(cond)                                                                   \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            throw std::logic_error(std::string(__func__) + ": assertion failed: " #cond);    \
        }                                                                                    \
    } while (0)
