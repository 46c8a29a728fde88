//! Scripts of the responses wire format. (Being written.)
