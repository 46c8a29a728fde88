//! Writes the seed inputs under `fuzz/seeds/` (run from anywhere):
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_seeds`.

use std::path::Path;

fn write(dir: &Path, seeds: Vec<(&str, Vec<u8>)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in seeds {
        let path = dir.join(name);
        std::fs::write(&path, &bytes)?;
        println!("{} ({} bytes)", path.display(), bytes.len());
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    // Store files, shared by open_store and cli_open.
    write(&seeds.join("stores"), lineage_fuzz::seeds::stores())?;
    write(&seeds.join("log_repair"), lineage_fuzz::seeds::logs())?;
    write(
        &seeds.join("decode_records"),
        lineage_fuzz::seeds::records(),
    )?;
    write(
        &seeds.join("model_stream"),
        lineage_fuzz::seeds::model_streams(),
    )?;
    Ok(())
}
