//! The error kinds the docs list agree with `spec/errors.json`, so that no list of the
//! backend errors (a C header's "Results:", a binding's docs) can leave one out.
//!
//! - Every enumeration of backend kinds anywhere in the docs, the C/C++ headers and the
//!   bindings' sources names all of them, unless it ends in `...` (a list that says it is not
//!   complete). An enumeration is a run of kind names (in any binding's spelling:
//!   `connection`, `TIMEOUT`, `ErrScript`, `UnavailableError`, `ERR_SHARDLIMIT_IO`...)
//!   separated by commas, slashes, "and"/"or", across comment line breaks and parentheticals.
//! - The Python error table (README and the Python README) and the Node one (`err.code`)
//!   have a row for every kind; the README's Errors section names every kind with its code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

struct Kind {
    name: String,
    code: u64,
    backend: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kinds() -> Vec<Kind> {
    let text = std::fs::read_to_string(root().join("spec/errors.json")).expect("spec/errors.json");
    let spec: serde_json::Value = serde_json::from_str(&text).expect("spec/errors.json is JSON");
    spec["kinds"]
        .as_array()
        .expect("kinds")
        .iter()
        .map(|k| Kind {
            name: k["name"].as_str().expect("name").to_string(),
            code: k["code"].as_u64().expect("code"),
            backend: k["backend"].as_bool().expect("backend"),
        })
        .collect()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The prose of a file: all of a Markdown file; the comments (and Python docstrings) of a
/// source file, each on its own line so that line numbers stay true. A table of error
/// classes in code (`connection: ConnectionError,`) is not a list in prose.
fn prose(rel: &str) -> String {
    let text = read(rel);
    if rel.ends_with(".md") {
        return text;
    }
    let python = rel.ends_with(".py") || rel.ends_with(".pyi");
    let mut in_doc = false;
    text.lines()
        .map(|line| {
            let t = line.trim_start();
            if python {
                let quotes = t.matches("\"\"\"").count();
                let keep = in_doc || quotes > 0;
                if quotes % 2 == 1 {
                    in_doc = !in_doc;
                }
                if keep {
                    return t.to_string();
                }
                return t
                    .split_once('#')
                    .map_or(String::new(), |(_, c)| c.to_string());
            }
            if let Some((_, c)) = line.split_once("//") {
                c.to_string()
            } else if t.starts_with('*') || t.starts_with("/*") {
                t.to_string()
            } else {
                String::new()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The files that talk about error kinds: docs, headers and the bindings' public sources.
fn documents() -> Vec<String> {
    let mut files = vec![
        "README.md".to_string(),
        "include/shardlimit.h".to_string(),
        "include/shardlimit.hpp".to_string(),
        "bindings/node/index.d.ts".to_string(),
        "bindings/node/index.js".to_string(),
        "bindings/python/python/shardlimit/_shardlimit.pyi".to_string(),
        "bindings/python/python/shardlimit/_errors.py".to_string(),
        "bindings/python/python/shardlimit/__init__.py".to_string(),
    ];
    for (dir, ext) in [
        ("docs", "md"),
        ("bindings/c", "md"),
        ("bindings/go", "md"),
        ("bindings/python", "md"),
        ("bindings/node", "md"),
        ("bindings/go", "go"),
    ] {
        let mut names: Vec<String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(&format!(".{ext}")) && !n.ends_with("_test.go"))
            .collect();
        names.sort();
        files.extend(names.into_iter().map(|n| format!("{dir}/{n}")));
    }
    files
}

/// The kind a word names in some binding's spelling, or None.
fn kind_of(word: &str, kinds: &[Kind]) -> Option<String> {
    let mut w = word;
    for prefix in ["SHARDLIMIT_ERR_", "ERR_SHARDLIMIT_", "ErrorKind::", "Err"] {
        if let Some(rest) = w.strip_prefix(prefix) {
            if !rest.is_empty() {
                w = rest;
                break;
            }
        }
    }
    let w = w
        .strip_suffix("Error")
        .filter(|r| !r.is_empty())
        .unwrap_or(w);
    // CamelCase (InvalidArgument) and SCREAMING_CASE to snake_case
    let mut snake = String::new();
    for (i, c) in w.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 && !w.chars().all(|c| !c.is_ascii_lowercase()) {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    kinds
        .iter()
        .find(|k| k.name == snake)
        .map(|k| k.name.clone())
}

/// Words that may stand in an enumeration of kinds without ending it.
fn filler(word: &str) -> bool {
    matches!(
        word,
        "and" | "or" | "OK" | "CLOSED" | "CANCELLED" | "Closed" | "Cancelled"
    )
}

struct Run {
    line: usize,
    text: String,
    backend: BTreeSet<String>,
    open_ended: bool,
}

/// `text` without its parentheticals, and the inside of each (without the parentheticals
/// nested in it): (byte offset in `text`, piece). What a piece leaves out, the
/// parentheses included, is spaces, one per byte, but newlines stay, so that offsets and
/// lines are those of `text`. A `(` never closed runs to the end; a `)` never opened stays.
fn without_parentheticals(text: &str) -> Vec<(usize, String)> {
    let mut done = Vec::new();
    // the text outside, then each parenthetical open at this point
    let mut open = vec![(0, String::new())];
    for (i, c) in text.char_indices() {
        let closes = c == ')' && open.len() > 1;
        let top = open.len() - 1;
        for (depth, (_, piece)) in open.iter_mut().enumerate() {
            if depth == top && c != '(' && !closes || c == '\n' {
                piece.push(c);
            } else {
                piece.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        }
        if c == '(' {
            open.push((i + 1, String::new()));
        } else if closes {
            done.extend(open.pop());
        }
    }
    done.extend(open);
    done
}

/// Every run of kind names in `text`, joined across comment line breaks and
/// parentheticals (a list goes on after one, and a list inside one is a run of its own),
/// in the order they start.
fn runs(text: &str, kinds: &[Kind]) -> Vec<Run> {
    let newlines: Vec<usize> = text.match_indices('\n').map(|(i, _)| i).collect();
    let mut out: Vec<(usize, Run)> = without_parentheticals(text)
        .into_iter()
        .flat_map(|(offset, piece)| {
            runs_in(&piece, kinds)
                .into_iter()
                .map(move |(start, run)| (offset + start, run))
        })
        .map(|(start, mut run)| {
            run.line = newlines.partition_point(|&n| n < start) + 1;
            (start, run)
        })
        .collect();
    out.sort_by_key(|(start, _)| *start);
    out.into_iter().map(|(_, run)| run).collect()
}

/// The runs of kind names in a piece without parentheses, each with its byte offset there
/// (`runs` sets their lines).
fn runs_in(text: &str, kinds: &[Kind]) -> Vec<(usize, Run)> {
    // (word, start, end) of every identifier-like word
    let bytes = text.as_bytes();
    let mut words = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric()
                    || bytes[i] == b'_'
                    || (bytes[i] == b':' && bytes.get(i + 1) == Some(&b':')))
            {
                i += if bytes[i] == b':' { 2 } else { 1 };
            }
            words.push((&text[start..i], start, i));
        } else {
            i += 1;
        }
    }
    // a gap that keeps a run going: separators, quotes, comment markers at line starts
    let joins = |gap: &str| {
        gap.chars().all(|c| {
            matches!(
                c,
                ',' | '/' | ' ' | '\t' | '\n' | '`' | '"' | '\'' | '|' | '#' | '*'
            )
        })
    };
    let mut out = Vec::new();
    let mut w = 0;
    while w < words.len() {
        if kind_of(words[w].0, kinds).is_none() {
            w += 1;
            continue;
        }
        let (first, mut last, mut through) = (w, w, w);
        for j in w + 1..words.len() {
            if !joins(&text[words[j - 1].2..words[j].1]) {
                break;
            }
            if kind_of(words[j].0, kinds).is_some() {
                last = j;
            } else if !filler(words[j].0) {
                break;
            }
            through = j;
        }
        let (start, end) = (words[first].1, words[last].2);
        let backend = words[first..=last]
            .iter()
            .filter_map(|(word, _, _)| kind_of(word, kinds))
            .filter(|k| kinds.iter().any(|x| x.backend && &x.name == k))
            .collect();
        let rest = text[words[through].2..].trim_start_matches(['`', '"', '\'', ')', ',', ' ']);
        let run = Run {
            line: 0,
            text: text[start..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            backend,
            open_ended: rest.starts_with("...") || rest.starts_with('…'),
        };
        out.push((start, run));
        w = last + 1;
    }
    out
}

#[test]
fn every_list_of_backend_kinds_names_them_all() {
    let kinds = kinds();
    let backend: BTreeSet<String> = kinds
        .iter()
        .filter(|k| k.backend)
        .map(|k| k.name.clone())
        .collect();
    assert!(
        backend.len() >= 4,
        "spec/errors.json lost its backend kinds"
    );
    let mut bad = Vec::new();
    for file in documents() {
        for run in runs(&prose(&file), &kinds) {
            if run.backend.len() >= 2 && run.backend != backend && !run.open_ended {
                let missing: Vec<_> = backend.difference(&run.backend).collect();
                bad.push(format!(
                    "{file}:{}: `{}` lacks {missing:?}",
                    run.line, run.text
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "lists of backend error kinds that miss some (add them, or end the list with `...`):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scanner_sees_lists_across_comment_lines_and_parentheses() {
    let kinds = kinds();
    let text = "// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT (an entry in\n\
                // Redis that shardlimit did not write), UNAVAILABLE, INTERNAL.\n\
                True when Redis failed (connection, timeout, script) rather than\n\
                `ErrorKind::Connection`, `Timeout`, `Unavailable`...\n\
                (`'connection'`, `'timeout'`, ...)\n";
    let runs = runs(text, &kinds);
    let lists: Vec<(usize, usize, bool)> = runs
        .iter()
        .filter(|r| r.backend.len() >= 2)
        .map(|r| (r.line, r.backend.len(), r.open_ended))
        .collect();
    assert_eq!(
        lists,
        vec![(1, 4, false), (3, 3, false), (4, 3, true), (5, 2, true)]
    );
}

#[test]
fn a_parenthetical_nested_unclosed_or_never_opened() {
    let kinds = kinds();
    // a list goes on past a parenthetical with one nested in it; a `)` never opened ends a
    // list; a `(` never closed holds a list of its own
    let text = "CONNECTION (a (nested) note), TIMEOUT, SCRIPT, UNAVAILABLE.\n\
                TIMEOUT) SCRIPT\n\
                see (CONNECTION, TIMEOUT\n";
    let lists: Vec<(usize, usize)> = runs(text, &kinds)
        .iter()
        .map(|r| (r.line, r.backend.len()))
        .collect();
    assert_eq!(lists, vec![(1, 4), (2, 1), (2, 1), (3, 2)]);
}

/// The names in the first column of the table whose header line is `header`.
fn table_column(text: &str, header: &str, column: usize) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    assert!(lines.next().is_some(), "no table with header {header:?}");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cell = l.split('|').nth(column).unwrap_or("");
            cell.split('`').nth(1).unwrap_or("").to_string()
        })
        .collect()
}

#[test]
fn the_python_and_node_error_tables_have_a_row_for_every_kind() {
    let kinds = kinds();
    let all: BTreeSet<String> = kinds.iter().map(|k| k.name.clone()).collect();
    let file = "bindings/python/README.md";
    let got: BTreeSet<String> = table_column(&read(file), "| class | kind | also a |", 2)
        .into_iter()
        .collect();
    assert_eq!(got, all, "{file}: the Python error table's kinds");
    let file = "bindings/node/README.md";
    let got: BTreeSet<String> = table_column(&read(file), "| class | `err.code` |", 2)
        .iter()
        .map(|c| {
            c.strip_prefix("ERR_SHARDLIMIT_")
                .unwrap_or_else(|| panic!("{file}: {c} is not an ERR_SHARDLIMIT_ code"))
                .to_ascii_lowercase()
        })
        .collect();
    assert_eq!(got, all, "{file}: the Node error table's codes");
}

#[test]
fn the_readme_errors_section_names_every_kind_with_its_code() {
    let readme = read("README.md");
    let section = readme
        .split("\n## Errors\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has an Errors section");
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    for k in kinds() {
        let named = format!("`{}` ({}", k.name, k.code);
        assert!(
            flat.contains(&named),
            "README Errors section lacks {named})"
        );
    }
}
