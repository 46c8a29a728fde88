//! Scripts of the anthropic wire format. (Being written.)
