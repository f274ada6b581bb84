//! Values crossing between the host language and PostgreSQL for statements a job runs
//! inside its idempotent transaction. A [`Param`] is converted to the type PostgreSQL
//! inferred for its placeholder; a [`Cell`] is read from a column by the column's type.
//! Unsupported pairs are errors that name the placeholder or column and suggest a cast.

use std::error::Error as StdError;

use bytes::BytesMut;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use uuid::Uuid;

type BoxError = Box<dyn StdError + Sync + Send>;

/// A bind parameter as the host language gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// SQL NULL, for a placeholder of any type.
    Null,
    /// For a boolean placeholder.
    Bool(bool),
    /// For an integer (int2/int4 when in range, int8), float or text placeholder.
    Int(i64),
    /// For a float8 or float4 placeholder (out of float4's range: an error).
    Float(f64),
    /// For a text, uuid, json/jsonb (checked JSON), bytea or date (`YYYY-MM-DD`)
    /// placeholder.
    Text(String),
    /// For a bytea placeholder.
    Bytes(Vec<u8>),
    /// JSON text (a Hash or Array serialised by the host language).
    Json(String),
    /// For a timestamptz or timestamp (as UTC) placeholder; not a date.
    Time(DateTime<Utc>),
}

impl Param {
    /// What the value is, in words of no host language (the messages reach every binding).
    fn kind(&self) -> &'static str {
        match self {
            Param::Null => "null",
            Param::Bool(_) => "a boolean",
            Param::Int(_) => "an integer",
            Param::Float(_) => "a float",
            Param::Text(_) => "a string",
            Param::Bytes(_) => "binary data",
            Param::Json(_) => "JSON (an object or array)",
            Param::Time(_) => "a time",
        }
    }
}

fn mismatch(param: &Param, ty: &Type) -> BoxError {
    format!(
        "cannot bind {} to a parameter of type {ty}; cast the placeholder in SQL (e.g. $1::text)",
        param.kind()
    )
    .into()
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match (self, ty) {
            (Param::Null, _) => Ok(IsNull::Yes),
            (Param::Bool(b), &Type::BOOL) => b.to_sql(ty, out),
            (Param::Int(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Param::Int(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Param::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (Param::Int(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Param::Int(i), &Type::FLOAT4) => (*i as f32).to_sql(ty, out),
            (Param::Float(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Param::Float(f), &Type::FLOAT4) => {
                let narrow = *f as f32;
                if f.is_finite() && !narrow.is_finite() {
                    return Err(format!("{f} is out of range for type float4").into());
                }
                narrow.to_sql(ty, out)
            }
            (Param::Int(i), t) if is_text(t) => i.to_string().to_sql(&Type::TEXT, out),
            (Param::Text(s), t) if is_text(t) => s.to_sql(&Type::TEXT, out),
            (Param::Text(s), &Type::UUID) => Uuid::parse_str(s)?.to_sql(ty, out),
            // JSON text goes as it is (checked, never re-encoded: big numbers keep
            // every digit). jsonb's binary form is a version byte, then the text.
            (Param::Text(s) | Param::Json(s), &Type::JSON | &Type::JSONB) => {
                serde_json::from_str::<serde::de::IgnoredAny>(s)?;
                if *ty == Type::JSONB {
                    out.extend_from_slice(&[1]);
                }
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            (Param::Bytes(b), &Type::BYTEA) => b.to_sql(ty, out),
            (Param::Text(s), &Type::BYTEA) => s.as_bytes().to_sql(ty, out),
            (Param::Time(t), &Type::TIMESTAMPTZ) => t.to_sql(ty, out),
            (Param::Time(t), &Type::TIMESTAMP) => t.naive_utc().to_sql(ty, out),
            (Param::Time(_), &Type::DATE) => Err(
                "a Time bound to a date is ambiguous across time zones: bind a Date (time.to_date)"
                    .into(),
            ),
            (Param::Text(s), &Type::DATE) => {
                NaiveDate::parse_from_str(s, "%Y-%m-%d")?.to_sql(ty, out)
            }
            _ => Err(mismatch(self, ty)),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true // checked per value in to_sql, with a message that names the types
    }

    to_sql_checked!();
}

fn is_text(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
    )
}

/// A column value read back, typed by the column's PostgreSQL type.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A boolean column.
    Bool(bool),
    /// An int2, int4, int8 or oid column.
    Int(i64),
    /// A float4 or float8 column.
    Float(f64),
    /// A text, varchar, bpchar, name or uuid column.
    Text(String),
    /// A bytea column.
    Bytes(Vec<u8>),
    /// json/jsonb as JSON text, for the host language to parse.
    Json(String),
    /// A timestamptz column, or a timestamp read as UTC.
    Time(DateTime<Utc>),
    /// date as year, month, day.
    Date(i32, u32, u32),
}

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        use chrono::Datelike;
        Ok(match *ty {
            Type::BOOL => Cell::Bool(bool::from_sql(ty, raw)?),
            Type::INT2 => Cell::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Cell::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Cell::Int(i64::from_sql(ty, raw)?),
            Type::OID => Cell::Int(u32::from_sql(ty, raw)?.into()),
            Type::FLOAT4 => Cell::Float(f32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Cell::Float(f64::from_sql(ty, raw)?),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                Cell::Text(String::from_sql(ty, raw)?)
            }
            Type::UUID => Cell::Text(Uuid::from_sql(ty, raw)?.to_string()),
            // The JSON text as stored, for the host language to parse exactly.
            Type::JSON => Cell::Json(String::from_utf8(raw.to_vec())?),
            Type::JSONB => match raw.split_first() {
                Some((1, text)) => Cell::Json(String::from_utf8(text.to_vec())?),
                _ => return Err("unsupported jsonb format version".into()),
            },
            Type::BYTEA => Cell::Bytes(raw.to_vec()),
            Type::TIMESTAMPTZ => Cell::Time(DateTime::<Utc>::from_sql(ty, raw)?),
            Type::TIMESTAMP => Cell::Time(NaiveDateTime::from_sql(ty, raw)?.and_utc()),
            Type::DATE => {
                let d = NaiveDate::from_sql(ty, raw)?;
                Cell::Date(d.year(), d.month(), d.day())
            }
            _ => {
                return Err(format!(
                    "columns of type {ty} are not converted; cast the column in SQL \
                     (e.g. total::text or total::float8)"
                )
                .into())
            }
        })
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, BoxError> {
        Ok(Cell::Null)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

/// Rows as column names and cells, in order.
pub type Rows = Vec<Vec<(String, Cell)>>;

/// Reads every row of a result into [`Rows`].
pub fn rows(result: Vec<tokio_postgres::Row>) -> Result<Rows, tokio_postgres::Error> {
    result
        .iter()
        .map(|row| {
            row.columns()
                .iter()
                .enumerate()
                .map(|(i, column)| Ok((column.name().to_string(), row.try_get::<_, Cell>(i)?)))
                .collect()
        })
        .collect()
}
