#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);  // CTest runs tests two at a time on two cores
  return RUN_ALL_TESTS();
}
