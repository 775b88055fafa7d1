//! A `protoc` for prost-build, so that building egress-proxy needs only the Rust toolchain:
//! `etcd-client`'s build script compiles etcd's API with prost-build, which runs `$PROTOC`
//! (`.cargo/config.toml` points it at the script beside this crate, which builds and runs
//! this program). It does the one thing prost-build asks of protoc — write the
//! `FileDescriptorSet` of some `.proto` files — with protox, a protobuf compiler in Rust:
//!
//! `protoc --include_imports [--include_source_info] -o OUT [-I DIR]... FILE...`
//!
//! (`--descriptor_set_out=OUT`, `-IDIR`, `--proto_path=DIR` and
//! `--experimental_allow_proto3_optional` are accepted too). Anything else is refused with a
//! message: a flag it does not know could change the output, and a wrong descriptor set must
//! not pass as a right one.

use std::path::PathBuf;
use std::process::ExitCode;

use prost::Message;

/// What was asked.
#[derive(Debug, Default)]
struct Asked {
    out: Option<PathBuf>,
    includes: Vec<PathBuf>,
    files: Vec<PathBuf>,
    imports: bool,
    source_info: bool,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Asked, String> {
    let mut asked = Asked::default();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match a.as_str() {
            "--include_imports" => asked.imports = true,
            "--include_source_info" => asked.source_info = true,
            // protox accepts proto3 `optional` without being asked.
            "--experimental_allow_proto3_optional" => {}
            "-o" => asked.out = Some(value("-o")?.into()),
            "-I" | "--proto_path" => asked.includes.push(value(&a)?.into()),
            "--version" => return Err("version".into()),
            _ => {
                if let Some(v) = a.strip_prefix("--descriptor_set_out=") {
                    asked.out = Some(v.into());
                } else if let Some(v) = a.strip_prefix("--proto_path=") {
                    asked.includes.push(v.into());
                } else if let Some(v) = a.strip_prefix("-o") {
                    asked.out = Some(v.into());
                } else if let Some(v) = a.strip_prefix("-I") {
                    asked.includes.push(v.into());
                } else if a.starts_with('-') {
                    return Err(format!(
                        "{a}: not supported (this protoc only writes descriptor sets)"
                    ));
                } else {
                    asked.files.push(a.into());
                }
            }
        }
    }
    if asked.out.is_none() {
        return Err("-o FILE (the descriptor set to write) is required".into());
    }
    if asked.files.is_empty() {
        return Err("no .proto file given".into());
    }
    Ok(asked)
}

fn main() -> ExitCode {
    let asked = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e == "version" => {
            println!("libprotoc 0.0 (egress-proxy-protoc, protox)");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("protoc: {e}");
            return ExitCode::from(2);
        }
    };
    let includes = if asked.includes.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        asked.includes.clone()
    };
    let compiled = protox::Compiler::new(&includes).and_then(|mut c| {
        c.include_imports(asked.imports)
            .include_source_info(asked.source_info)
            .open_files(&asked.files)?;
        Ok(c.file_descriptor_set())
    });
    let set = match compiled {
        Ok(s) => s,
        Err(e) => {
            eprintln!("protoc: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(out) = asked.out else {
        return ExitCode::FAILURE;
    };
    if let Err(e) = std::fs::write(&out, set.encode_to_vec()) {
        eprintln!("protoc: cannot write {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn reads_what_prost_build_sends() {
        let a = parse(args(
            "--include_imports --include_source_info -o /tmp/x.bin -I proto -Iother a.proto b.proto",
        ))
        .unwrap();
        assert!(a.imports && a.source_info);
        assert_eq!(a.out, Some(PathBuf::from("/tmp/x.bin")));
        assert_eq!(a.includes, vec![PathBuf::from("proto"), PathBuf::from("other")]);
        assert_eq!(a.files.len(), 2);
    }

    #[test]
    fn refuses_what_it_does_not_do() {
        assert!(parse(args("--rust_out=x -o y a.proto")).is_err());
        assert!(parse(args("--include_imports a.proto")).is_err());
        assert!(parse(args("-o y")).is_err());
    }

    #[test]
    fn compiles_a_file_with_an_import() {
        let dir = std::env::temp_dir().join(format!("egress-protoc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.proto"), "syntax = \"proto3\"; message B { int32 x = 1; }").unwrap();
        std::fs::write(
            dir.join("a.proto"),
            "syntax = \"proto3\"; import \"b.proto\"; message A { B b = 1; optional string s = 2; }",
        )
        .unwrap();
        let mut c = protox::Compiler::new([&dir]).unwrap();
        c.include_imports(true).open_files(["a.proto"]).unwrap();
        let set = c.file_descriptor_set();
        let names: Vec<_> = set.file.iter().map(|f| f.name().to_string()).collect();
        assert_eq!(names, vec!["b.proto", "a.proto"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
