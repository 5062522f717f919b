// A file check_engine_names.sh must reject (ctest engine_names_catches_names): one format
// name in an identifier, one in a comment, one in a string, in mixed case.
bool is_blockwise_fp32(int scale_dtype);
// The tensor factor of NVFP4 directions.
const char* kExample = "{format: Float8}";
