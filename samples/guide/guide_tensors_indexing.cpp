#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Tensor x = Tensor::arange(0, 12).reshaped({3, 4});  // rows [0..3], [4..7], [8..11]
    Tensor last_row = x.select(0, -1);                 // (4) [8 9 10 11]: a copy
    Tensor middle = x.narrow(1, 1, 2);                 // (3, 2) columns 1 and 2: a copy
    Tensor picked = index_select(x, 0, Tensor::from_vector(std::vector<std::int64_t>{2, 0, 2}, {3}));
    Tensor masked = masked_fill(x, x > 5.0, -1.0);     // entries above 5 become -1
    Tensor swapped = permute(x.unsqueeze(0), {2, 0, 1});  // (1, 3, 4) -> (4, 1, 3): a copy
    Tensor wide = expand(x.narrow(0, 0, 1), {3, 4});   // row 0 repeated three times: a copy
    Tensor flat = x.flatten();                         // (12): a view of x's storage
    std::cout << "last row " << last_row << "\nmiddle " << to_string(middle.shape()) << "\npicked rows 2,0,2 "
              << to_string(picked.shape()) << "\nmasked " << masked << "\nswapped " << to_string(swapped.shape()) << "\n";

    flat.set({0}, 100.0);  // a view: the write shows through x
    bool ok = equal(last_row, Tensor::of({8, 9, 10, 11})) && middle.at({2, 1}) == 10.0 &&
              picked.at({1, 3}) == 3.0 && masked.at({1, 2}) == -1.0 && masked.at({1, 1}) == 5.0 &&
              swapped.shape() == Shape{4, 1, 3} && swapped.at({3, 0, 2}) == 11.0 && wide.at({2, 3}) == 3.0 &&
              x.at({0, 0}) == 100.0 && flat.shares_storage_with(x) && !last_row.shares_storage_with(x);
    std::cout << (ok ? "ok" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
