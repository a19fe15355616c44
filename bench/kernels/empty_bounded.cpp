void empty_bounded(kiln::program_id, const float*, int64_t, int64_t) {}
