// Checks a plugin candidate file before the dynamic loader sees it (internal to the registry).
//
// dlopen trusts the file: a FIFO blocks it forever, a device never ends, and an ELF file cut
// short maps segments past the end of the file, so the first touch of one kills the process
// with SIGBUS. So before dlopen a candidate must be a regular file that opens without
// blocking, whose ELF header is for this machine and whose program headers and loadable
// segments lie inside the file. What this cannot catch: a file changed between this check and
// dlopen (the plugin directories are trusted not to be rewritten while a process loads them).
#pragma once

#include <string>

namespace qrecipe::registry_internal {

// Why `path` must not be handed to dlopen, or "" when it may be. The reason says what was
// found and what to do ("not a regular file (a FIFO); remove it from the plugin path").
std::string plugin_file_problem(const std::string& path);

// "a FIFO", "a directory", "a character device", ... for a stat st_mode.
const char* file_type_name(unsigned mode);

}  // namespace qrecipe::registry_internal
