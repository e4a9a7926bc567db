//! Cluster-file text → `TaskConfig`, with and without `TESSERA__` environment overrides (the
//! input's first line, `KEY=VALUE`, when it starts with `TESSERA__`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera::cluster::TaskConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (env, toml) = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("TESSERA__") => match first.split_once('=') {
            Some((k, v)) => (vec![(k.to_string(), v.to_string())], rest),
            None => (Vec::new(), text),
        },
        _ => (Vec::new(), text),
    };
    if let Err(e) = TaskConfig::from_toml_with_env(toml, "fuzz.toml", env) {
        // Every error must render (messages name the file and key).
        let _ = e.to_string();
    }
});
