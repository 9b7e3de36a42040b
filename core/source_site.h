// Call sites outside C++: a std::source_location naming a file and line of another language (the Python
// caller of an op, python/), so nodes, eager calls and every error message that prints a creation site
// ("recorded at train.py:42") name the user's own line through the one mechanism C++ callers use.
#pragma once
#include <source_location>
#include <string_view>

namespace dyngrad {

// A source_location whose file_name(), function_name() and line() are the given ones. The strings are
// copied into a process-wide table (each distinct site once, never freed), so the result stays valid for
// the life of the process like a compiler-made one. Where the standard library's source_location cannot
// be built this way (see source_site.cpp), it is the location of this call instead.
std::source_location foreign_site(std::string_view file, std::string_view function, unsigned line);

}  // namespace dyngrad
