void empty(kiln::program_id, const float*, int64_t) {}
