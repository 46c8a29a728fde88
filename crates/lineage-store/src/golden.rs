//! Golden vectors of store format 2 blocks (`schema/golden/blocks.txt`).
