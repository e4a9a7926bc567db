//! A CSV reader for numeric data: every column a number, one of them an integer label, and
//! optionally some columns of integer ids (categorical features such as a user or an item,
//! which an embedding model looks up in a table) beside the dense ones.
//!
//! Lines are split on commas (no quoting: numeric data has none; a header's names may be
//! double-quoted); surrounding whitespace is ignored, blank lines are skipped, and a header
//! line is skipped: detected (a first row whose fields do not all parse as numbers, as
//! spreadsheets and pandas' `to_csv` write it) or forced. The label's column is the last, a
//! 0-based index or a header name. Every row must have as many columns as the first. A bad
//! row is INVALID_ARGUMENT naming the file, the 1-based line and column, and the bad text, so
//! the user can fix it in an editor.

use std::path::Path;

use super::Dataset;
use crate::error::{Result, Status};

/// A column, by index or header name: the label's (`--label_column`) or an id column's
/// (`--id_columns`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelColumn {
    /// The column at this 0-based index.
    Index(usize),
    /// The column with this name in the header line.
    Name(String),
}

impl LabelColumn {
    /// `--label_column`: digits are a 0-based index, anything else a header name.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_for(text, "--label_column")
    }

    /// A column named by `flag`: digits are a 0-based index, anything else a header name.
    pub fn parse_for(text: &str, flag: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{flag} names an empty column; give a header name or a 0-based column index"
            )));
        }
        Ok(match text.parse::<usize>() {
            Ok(i) => Self::Index(i),
            Err(_) => Self::Name(text.to_owned()),
        })
    }
}

impl std::fmt::Display for LabelColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

/// How [`read_csv`] reads a file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CsvOptions {
    /// The label's column; `None` is the last column.
    pub label_column: Option<LabelColumn>,
    /// Whether the first non-blank line is a header to skip: `Some(true)` always,
    /// `Some(false)` never, `None` when its fields do not all parse as numbers.
    pub header: Option<bool>,
    /// Columns of integer ids (any i64), kept apart from the float features
    /// ([`Dataset::ids`]); empty for none.
    pub id_columns: Vec<LabelColumn>,
}

/// Reads a CSV file of numeric features, ids in `options.id_columns`, and an integer label
/// (>= 0).
pub fn read_csv(path: impl AsRef<Path>, options: &CsvOptions) -> Result<Dataset> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| {
        let status = match e.kind() {
            std::io::ErrorKind::NotFound => Status::not_found,
            std::io::ErrorKind::PermissionDenied => Status::permission_denied,
            std::io::ErrorKind::InvalidData => Status::invalid_argument,
            _ => Status::unavailable,
        };
        status(format!("cannot read CSV file {}: {e}", path.display()))
    })?;
    parse_csv(&text, &path.display().to_string(), options)
}

/// A header cell's name: trimmed, surrounding double quotes removed.
fn header_name(cell: &str) -> String {
    let cell = cell.trim();
    cell.strip_prefix('"')
        .and_then(|c| c.strip_suffix('"'))
        .map(|c| c.replace("\"\"", "\""))
        .unwrap_or_else(|| cell.to_owned())
}

/// Parses CSV text; `file` names it in errors.
pub fn parse_csv(text: &str, file: &str, options: &CsvOptions) -> Result<Dataset> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut features = Vec::new();
    let mut ids = Vec::new();
    let mut labels = Vec::new();
    let mut width: Option<usize> = None;
    // The header's names and line, once read.
    let mut header: Option<(Vec<String>, usize)> = None;
    let mut first = true;
    let mut label_col: Option<usize> = None;
    let mut id_cols: Option<Vec<bool>> = None;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let at = |col: usize| format!("{file}:{line_no}: column {col}");
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if std::mem::take(&mut first) {
            let is_header = options
                .header
                .unwrap_or_else(|| !cells.iter().all(|c| c.parse::<f64>().is_ok()));
            if is_header {
                if options.header.is_none() {
                    tracing::info!(
                        file,
                        line = line_no,
                        "first row is not all numbers; read as a header line"
                    );
                }
                let names: Vec<String> = cells.iter().map(|c| header_name(c)).collect();
                width = Some(names.len());
                header = Some((names, line_no));
                continue;
            }
        }
        let w = *width.get_or_insert(cells.len());
        if cells.len() != w {
            let before = if header.is_some() {
                "the header"
            } else {
                "the rows before it"
            };
            return Err(Status::invalid_argument(format!(
                "{file}:{line_no}: the row has {} columns, {before} {w}; make every row as \
                 wide as the first",
                cells.len()
            )));
        }
        if w < 2 {
            return Err(Status::invalid_argument(format!(
                "{file}:{line_no}: a row needs at least one feature and a label, got {w} column; \
                 separate the columns with commas"
            )));
        }
        let label_col = match label_col {
            Some(c) => c,
            None => *label_col.insert(resolve_label(file, options, &header, line_no, w)?),
        };
        let id_cols = match &id_cols {
            Some(cols) => cols,
            None => id_cols.insert(resolve_ids(file, options, &header, line_no, w, label_col)?),
        };
        for (c, cell) in cells.iter().enumerate() {
            if id_cols[c] {
                let id: i64 = cell.parse().map_err(|_| {
                    Status::invalid_argument(format!(
                        "{}: id `{cell}` is not an integer; an id column (--id_columns) holds                          64-bit integers",
                        at(c + 1)
                    ))
                })?;
                ids.push(id);
            } else if c == label_col {
                let label: i64 = cell.parse().ok().filter(|&l: &i64| l >= 0).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "{}: label `{cell}` is not a non-negative integer; labels are class \
                         numbers 0, 1, ... (pick the label's column with --label_column)",
                        at(c + 1)
                    ))
                })?;
                labels.push(label);
            } else {
                let v: f32 = cell
                    .parse()
                    .ok()
                    .filter(|v: &f32| v.is_finite())
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "{}: `{cell}` is not a finite number; every feature must be one",
                            at(c + 1)
                        ))
                    })?;
                features.push(v);
            }
        }
    }
    let Some(w) = width.filter(|_| !labels.is_empty()) else {
        return Err(Status::invalid_argument(format!(
            "{file}: the CSV file has no data rows"
        )));
    };
    let num_ids = options.id_columns.len();
    Dataset::with_ids(features, w - 1 - num_ids, ids, num_ids, labels)
}

/// Which of the `w` columns hold ids: `options.id_columns` resolved, each once and none the
/// label's.
fn resolve_ids(
    file: &str,
    options: &CsvOptions,
    header: &Option<(Vec<String>, usize)>,
    line_no: usize,
    w: usize,
    label_col: usize,
) -> Result<Vec<bool>> {
    let mut is_id = vec![false; w];
    for column in &options.id_columns {
        let c = resolve_column(file, column, "--id_columns", header, line_no, w)?;
        if c == label_col {
            return Err(Status::invalid_argument(format!(
                "{file}: id column {column} is the label's column; drop it from --id_columns \
                 or choose another --label_column"
            )));
        }
        if std::mem::replace(&mut is_id[c], true) {
            return Err(Status::invalid_argument(format!(
                "{file}: --id_columns names column {column} twice; name each id column once"
            )));
        }
    }
    Ok(is_id)
}

/// The label's 0-based column among `w`, from the options and the header.
fn resolve_label(
    file: &str,
    options: &CsvOptions,
    header: &Option<(Vec<String>, usize)>,
    line_no: usize,
    w: usize,
) -> Result<usize> {
    match &options.label_column {
        None => Ok(w - 1),
        Some(column) => resolve_column(file, column, "--label_column", header, line_no, w),
    }
}

/// `column`'s 0-based index among `w`, from the header for a name; `flag` is the option that
/// named it (`--label_column`, `--id_columns`).
fn resolve_column(
    file: &str,
    column: &LabelColumn,
    flag: &str,
    header: &Option<(Vec<String>, usize)>,
    line_no: usize,
    w: usize,
) -> Result<usize> {
    let what = if flag == "--label_column" {
        "label column"
    } else {
        "id column"
    };
    match column {
        LabelColumn::Index(i) if *i < w => Ok(*i),
        LabelColumn::Index(i) => Err(Status::invalid_argument(format!(
            "{file}:{line_no}: {what} {i} does not exist; rows have {w} columns, set {flag} to \
             an index from 0 to {}{}",
            w - 1,
            match header {
                Some((names, _)) => format!(" or to a name ({})", names.join(", ")),
                None => String::new(),
            }
        ))),
        LabelColumn::Name(name) => match header {
            Some((names, header_line)) => names.iter().position(|n| n == name).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{file}:{header_line}: {what} `{name}` is not in the header (columns: {}); \
                     set {flag} to one of them or to a 0-based index",
                    names.join(", ")
                ))
            }),
            None => Err(Status::invalid_argument(format!(
                "{file}:{line_no}: {what} `{name}` is a name, but the file has no header line \
                 (its first row is all numbers); set {flag} to a 0-based index, or add a \
                 header line (--csv_header if its names are numbers)"
            ))),
        },
    }
}
