// mul_mat_id's pairs grouped by expert: the layout of the int32 scratch buffer that mul_mat_id_group
// (mul_mat_id_groups.metal) writes from the ids and the grouped product (mul_mat_id.metal) reads. The host
// sizes it the same way (launch_plans.h, mul_mat_id_scratch_bytes).
//   offsets: experts + 2 entries; offsets[b] is where bucket b's pairs start in `sorted` (buckets 0 ..
//            experts - 1 are the experts, bucket `experts` holds the pairs whose id is outside [0, experts));
//            offsets[experts + 1] = tokens * n_used;
//   cursor:  experts + 1 entries, the grouping's running write position per bucket (its own scratch);
//   sorted:  tokens * n_used pair indices (p = token * n_used + slot), bucket by bucket, each bucket in
//            increasing pair order.
// Each part starts on a 16-byte boundary.
#pragma once
#include "kernels/metal/common.h"

inline uint round_up4(uint n) { return (n + 3u) / 4u * 4u; }

inline bool valid_expert(int id, uint experts) { return id >= 0 && uint(id) < experts; }

// A pair's bucket: its expert, or `experts` for an id that names none.
inline uint bucket_of(int id, uint experts) { return valid_expert(id, experts) ? uint(id) : experts; }

// Where the parts start in the scratch buffer, in int32 entries (offsets start at 0).
inline uint cursor_part(constant MulMatIdArgs& a) { return round_up4(a.experts + 2); }
inline uint sorted_part(constant MulMatIdArgs& a) { return cursor_part(a) + round_up4(a.experts + 1); }
