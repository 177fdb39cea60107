//! The envelope of a stored state: the header row (format, codec, length,
//! checksum, generation, chunk count, expiry, version), its encoding, and the
//! read check [`assemble`] that turns chunks back into bytes or a typed
//! [`Error::Corrupt`].

use serde::{Deserialize, Serialize};

use super::{Codec, StateKey, MAX_STATE_BYTES};
use crate::{Error, Result, Timestamp};

/// The envelope format written by this version: 2, a header row that may carry
/// a small state inline ([`StateHeader::encode_row`]). Format 1 (a JSON header
/// alone, the bytes always in chunk rows) is still read.
pub const STATE_FORMAT: u32 = 2;

/// The first bytes of a format-2 header row.
const ROW_MAGIC: &[u8; 4] = b"RCS2";

/// The envelope: the header row of a stored state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHeader {
    /// Envelope format ([`STATE_FORMAT`]).
    pub format: u32,
    /// How the bytes were serialized.
    pub codec: Codec,
    /// Length of the state, bytes.
    pub len: u64,
    /// xxHash3-64 of the state's bytes, hex.
    pub checksum: String,
    /// The generation whose chunks hold the bytes.
    pub generation: String,
    /// How many chunks.
    pub chunks: u32,
    /// When the state expires (UTC ms), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// A tombstone left by a clear: no state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleared: bool,
    /// The bytes follow the header in its own row (no chunk rows).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inline: bool,
    /// The version of the type that wrote the state (the typed layer's
    /// `with_version`; 0 when it does not say).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl StateHeader {
    /// The header of `data` stored under `generation` in `chunks` chunks.
    pub fn of(
        data: &[u8],
        codec: Codec,
        generation: String,
        chunks: u32,
        expires_at: Option<Timestamp>,
    ) -> Self {
        StateHeader {
            format: STATE_FORMAT,
            codec,
            len: data.len() as u64,
            checksum: checksum(data),
            generation,
            chunks,
            expires_at,
            cleared: false,
            inline: false,
            version: 0,
        }
    }

    /// A tombstone under `generation` (no chunks).
    pub fn tombstone(generation: String) -> Self {
        StateHeader {
            cleared: true,
            ..StateHeader::of(&[], Codec::Raw, generation, 0, None)
        }
    }

    /// The header row as stored: `RCS2`, the JSON header's length (u32, big
    /// endian), the JSON header, then `inline` (the state's bytes when
    /// [`inline`](Self::inline), else empty).
    pub fn encode_row(&self, inline: &[u8]) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut row = Vec::with_capacity(8 + json.len() + inline.len());
        row.extend_from_slice(ROW_MAGIC);
        row.extend_from_slice(&(json.len() as u32).to_be_bytes());
        row.extend_from_slice(&json);
        row.extend_from_slice(inline);
        row
    }

    /// A stored header row: the header and the bytes after it (empty unless
    /// the state is inline). Reads format 1 (a JSON header alone) and 2.
    ///
    /// # Errors
    /// [`Error::Corrupt`] (naming `key`) for bytes that are not a header of a
    /// format this version reads.
    pub fn decode_row<'a>(key: &StateKey, bytes: &'a [u8]) -> Result<(StateHeader, &'a [u8])> {
        let (json, rest) =
            split_row(bytes).ok_or_else(|| Error::corrupt(key.to_string(), "header: not a header row"))?;
        let h: StateHeader = serde_json::from_slice(json)
            .map_err(|e| Error::corrupt(key.to_string(), format!("header: {e}")))?;
        if !(1..=STATE_FORMAT).contains(&h.format) {
            return Err(Error::corrupt(
                key.to_string(),
                format!(
                    "header format {} (this version reads 1 to {STATE_FORMAT}: written by a newer version?)",
                    h.format
                ),
            ));
        }
        Ok((h, rest))
    }

    /// A stored header ([`decode_row`](Self::decode_row) without the bytes).
    ///
    /// # Errors
    /// As [`decode_row`](Self::decode_row).
    pub fn decode(key: &StateKey, bytes: &[u8]) -> Result<StateHeader> {
        Self::decode_row(key, bytes).map(|(h, _)| h)
    }

    /// Whether the state has expired at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// A header row's JSON header and the bytes after it: format 2's frame, or a
/// format-1 row (JSON alone).
fn split_row(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    if bytes.first() == Some(&b'{') {
        return Some((bytes, &[]));
    }
    let rest = bytes.strip_prefix(ROW_MAGIC.as_slice())?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// How many leading bytes of a header row are its frame and JSON header (the
/// rest is a small state's bytes): a provider may store the two apart, so that
/// a commit reads back only the head of the row it replaces. The whole row for
/// format 1 and for bytes that are not a header row.
pub fn row_head_len(row: &[u8]) -> usize {
    match split_row(row) {
        Some((json, _)) if row.first() != Some(&b'{') => ROW_MAGIC.len() + 4 + json.len(),
        _ => row.len(),
    }
}

/// The generation whose chunk rows a replaced header row published (`None`
/// for an inline state, a tombstone, or bytes that are not a header): what a
/// commit's [`Commit::Done::replaced`](super::Commit::Done::replaced) holds. Reads only the frame and the JSON
/// header, so a provider may pass the row's head alone ([`row_head_len`]).
pub fn replaced_generation(row: &[u8]) -> Option<String> {
    let (json, _) = split_row(row)?;
    let h: StateHeader = serde_json::from_slice(json).ok()?;
    (h.chunks > 0).then_some(h.generation)
}

/// The checksum of a state's bytes (xxHash3-64, hex).
pub fn checksum(data: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(data))
}

/// A fresh generation id: the time (ms, 13 digits, so ids sort by time) and 32
/// random bits.
pub fn new_generation(now: Timestamp) -> String {
    format!("{:013}-{:08x}", now.as_millis(), rand::random::<u32>())
}

/// The time a generation id was made (ms), if it is one.
pub fn generation_time(generation: &str) -> Option<u64> {
    generation.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

/// The bytes of a state from its header and chunks, checked: every chunk
/// present, the length and the checksum right.
///
/// # Errors
/// [`Error::Corrupt`] naming `key` and what does not check out.
pub fn assemble(key: &StateKey, header: &StateHeader, chunks: Vec<Option<Vec<u8>>>) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(header.len.min(MAX_STATE_BYTES) as usize);
    for (i, c) in chunks.into_iter().enumerate() {
        match c {
            Some(c) => data.extend_from_slice(&c),
            None => {
                return Err(Error::corrupt(
                    key.to_string(),
                    format!("chunk {i} of generation {} is missing", header.generation),
                ))
            }
        }
    }
    verify(key, header, &data)?;
    Ok(data)
}

/// The length and checksum of `data` against `header`.
pub(super) fn verify(key: &StateKey, header: &StateHeader, data: &[u8]) -> Result<()> {
    if data.len() as u64 != header.len {
        return Err(Error::corrupt(
            key.to_string(),
            format!("{} bytes stored, the header says {}", data.len(), header.len),
        ));
    }
    if checksum(data) != header.checksum {
        return Err(Error::corrupt(key.to_string(), "checksum mismatch"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::key;
    use super::*;

    #[test]
    fn header_rows_round_trip_and_format_1_still_reads() {
        let data = b"hello".to_vec();
        let mut h = StateHeader::of(&data, Codec::Json, "g".into(), 0, None);
        h.inline = true;
        let row = h.encode_row(&data);
        let (back, inline) = StateHeader::decode_row(&key(), &row).unwrap();
        assert_eq!((back, inline), (h, data.as_slice()));
        assert_eq!(replaced_generation(&row), None, "inline: no chunk rows");
        let head = row_head_len(&row);
        assert_eq!(
            &row[head..],
            data.as_slice(),
            "the head ends where the bytes start"
        );
        assert_eq!(StateHeader::decode(&key(), &row[..head]).unwrap().len, 5);
        let v1 = br#"{"format":1,"codec":"json","len":5,"checksum":"x","generation":"g1","chunks":1}"#;
        let (old, rest) = StateHeader::decode_row(&key(), v1).unwrap();
        assert_eq!((old.format, old.chunks, rest.len()), (1, 1, 0));
        assert_eq!(replaced_generation(v1), Some("g1".into()));
        assert_eq!(replaced_generation(&v1[..20]), None, "cut: not a header");
        for bad in [&b"RCS2\0\0\0\x09{}"[..], b"RCS", b"xyz", b""] {
            assert!(
                matches!(StateHeader::decode_row(&key(), bad), Err(Error::Corrupt { .. })),
                "{bad:?}"
            );
        }
        let newer = br#"{"format":3,"codec":"json","len":0,"checksum":"x","generation":"g","chunks":0}"#;
        let e = StateHeader::decode(&key(), newer).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }

    #[test]
    fn assemble_checks_every_chunk_length_and_checksum() {
        let data = b"hello world".to_vec();
        let h = StateHeader::of(&data, Codec::Raw, "g".into(), 2, None);
        let ok = assemble(
            &key(),
            &h,
            vec![Some(b"hello ".to_vec()), Some(b"world".to_vec())],
        )
        .unwrap();
        assert_eq!(ok, data);
        for bad in [
            vec![Some(b"hello ".to_vec()), None],
            vec![Some(b"hello ".to_vec()), Some(b"worl".to_vec())],
            vec![Some(b"hello ".to_vec()), Some(b"World".to_vec())],
        ] {
            assert!(matches!(assemble(&key(), &h, bad), Err(Error::Corrupt { .. })));
        }
        assert!(matches!(
            StateHeader::decode(&key(), b"{nope"),
            Err(Error::Corrupt { .. })
        ));
    }
}
