//! Scripts of the chat wire format. (Being written.)
