#pragma once
// empty: cuda_emu.h (force-included) defines what the CUDA header would
