#ifndef C_LIBFUZZER_H
#define C_LIBFUZZER_H

#include <stddef.h>
#include <stdint.h>

// libFuzzer's driver, for programs that keep their own main (SwiftPM renames an executable's
// main, so libFuzzer's cannot be used). Defined by libclang_rt.fuzzer, linked by -sanitize=fuzzer;
// only called in the FUZZING build.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
