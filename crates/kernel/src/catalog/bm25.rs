//! The lexical ranker: BM25F over a tool's name, title, description, parameter names and
//! parameter descriptions, each field with its own weight and length normalization.
//!
//! Hand-written on purpose, in about two hundred lines: the catalog is at most
//! [`ring0_core::limits::CATALOG_TOOLS_MAX`] short documents held in memory and rebuilt with
//! each kernel generation, and it needs per-field weights (a term in a tool's name says far more
//! than the same term in a parameter's description). The crates that rank with BM25 either
//! index a single text per document (`bm25`, no field weights) or bring a whole search engine
//! with its on-disk segments, threads and dozens of dependencies (`tantivy`). The tokenizer, an
//! English stemmer (`rust-stemmers`' Snowball) and the BM25F sum are all that is needed here.

use std::collections::HashMap;

/// The fields of a tool's document, in the order of [`FIELD_WEIGHTS`].
pub const FIELDS: usize = 5;
/// How much a term found in each field counts: name, title, description, parameter names,
/// parameter descriptions. Chosen on the BFCL catalog (`cargo bench -p ring0-kernel --bench
/// catalog`).
pub const FIELD_WEIGHTS: [f32; FIELDS] = [3.0, 2.0, 1.5, 1.0, 0.4];
/// Length normalization per field (BM25's `b`): names and titles are short and hardly vary.
const FIELD_B: [f32; FIELDS] = [0.3, 0.3, 0.75, 0.5, 0.75];
/// Term-frequency saturation (BM25's `k1`).
const K1: f32 = 1.2;
/// Distinct terms taken from one query, in its order; the rest are ignored. Sized for the
/// longest query the meta-tool accepts (1 KiB, about 150 words): a request restating a long
/// task must not lose its last words (at 32, recall@5 on the BFCL catalog was 0.885; at 64
/// and above, 0.903).
pub const QUERY_TERMS_MAX: usize = 128;
/// Terms of one field of one document; the rest are ignored.
const FIELD_TERMS_MAX: usize = 4096;

/// Words that carry no meaning for finding a tool.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "any", "are", "as", "at", "be", "by", "can", "do", "for", "from", "give",
    "given", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of",
    "on", "or", "please", "so", "that", "the", "their", "then", "there", "this", "to", "us", "use",
    "using", "was", "we", "what", "when", "where", "which", "who", "will", "with", "you", "your",
    // The fillers of a spoken request.
    "also", "about", "could", "would", "should", "like", "want", "need", "tell", "show", "know",
    "just", "let", "some", "am", "our", "these", "those", "been", "did", "does",
];

/// The text of one tool, split into the fields the ranker weighs.
#[derive(Debug, Clone, Default)]
pub struct ToolDocument {
    pub name: String,
    pub title: String,
    pub description: String,
    pub parameter_names: String,
    pub parameter_descriptions: String,
}

impl ToolDocument {
    fn fields(&self) -> [&str; FIELDS] {
        [
            &self.name,
            &self.title,
            &self.description,
            &self.parameter_names,
            &self.parameter_descriptions,
        ]
    }
}

/// Lowercase terms of `text`: split at anything not alphanumeric, at lower-to-upper case
/// changes (`getWeather`) and between letters and digits; stop words, one-letter words and
/// numbers dropped (a number in a request is an argument's value — "5 units", "10 years" —
/// and says nothing of which tool to use; dropping them raised recall@5 on the BFCL catalog
/// from 0.880 to 0.886); each term reduced by [`stem`].
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev: Option<char> = None;
    for c in text.chars() {
        let boundary = match prev {
            _ if !c.is_alphanumeric() => true,
            Some(p) => {
                (p.is_lowercase() && c.is_uppercase())
                    || (p.is_alphabetic() && c.is_numeric())
                    || (p.is_numeric() && c.is_alphabetic())
            }
            None => false,
        };
        if boundary {
            push_term(&mut out, &mut word);
        }
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
            prev = Some(c);
        } else {
            prev = None;
        }
    }
    push_term(&mut out, &mut word);
    out
}

fn push_term(out: &mut Vec<String>, word: &mut String) {
    let numeric = word.chars().all(|c| c.is_ascii_digit());
    if word.chars().count() > 1 && !numeric && !STOP_WORDS.contains(&word.as_str()) {
        out.push(stem(word));
    }
    word.clear();
}

/// The English Snowball (Porter2) stemmer, so that "calculate", "calculating", "calculated"
/// and "calculation" meet, as do plurals and "invented" / "invention", "genetics" /
/// "genetically". A query's words and a definition's go through the same stemmer, so only
/// agreement matters; Porter2 is the standard for English retrieval and needs no data.
/// Words that are not plain ASCII letters (identifiers with digits, other scripts) are kept
/// as they are.
pub fn stem(word: &str) -> String {
    static ENGLISH: std::sync::LazyLock<rust_stemmers::Stemmer> = std::sync::LazyLock::new(|| {
        rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English)
    });
    if !word.chars().all(|c| c.is_ascii_lowercase()) || word.len() <= 3 {
        return word.to_string();
    }
    ENGLISH.stem(word).into_owned()
}

/// One document's occurrences of a term, per field.
#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    tf: [u16; FIELDS],
}

/// An inverted index of tool documents, ranked with BM25F.
#[derive(Debug, Default)]
pub struct Bm25Index {
    postings: HashMap<String, Vec<Posting>>,
    lengths: Vec<[u32; FIELDS]>,
    average: [f32; FIELDS],
}

impl Bm25Index {
    /// Indexes `docs`; a document's position is its id in [`Bm25Index::rank`].
    pub fn build(docs: &[ToolDocument]) -> Self {
        assert!(docs.len() <= u32::MAX as usize);
        let mut index = Self::default();
        let mut totals = [0u64; FIELDS];
        for (doc, document) in docs.iter().enumerate() {
            let mut counts: HashMap<String, [u16; FIELDS]> = HashMap::new();
            let mut lengths = [0u32; FIELDS];
            for (field, text) in document.fields().iter().enumerate() {
                let field_terms = terms(text);
                let field_terms = &field_terms[..field_terms.len().min(FIELD_TERMS_MAX)];
                lengths[field] = field_terms.len() as u32;
                totals[field] += field_terms.len() as u64;
                for term in field_terms {
                    let tf = &mut counts.entry(term.clone()).or_default()[field];
                    *tf = tf.saturating_add(1);
                }
            }
            for (term, tf) in counts {
                index.postings.entry(term).or_default().push(Posting {
                    doc: doc as u32,
                    tf,
                });
            }
            index.lengths.push(lengths);
        }
        let n = docs.len().max(1) as f32;
        for (average, total) in index.average.iter_mut().zip(totals) {
            *average = (total as f32 / n).max(1.0);
        }
        index
    }

    /// Documents that match `query`, scored (higher is better), unsorted. `scores` is scratch
    /// space of the catalog's size, left zeroed.
    pub fn rank(&self, query: &str, scores: &mut Vec<f32>) -> Vec<(u32, f32)> {
        scores.clear();
        scores.resize(self.lengths.len(), 0.0);
        // The first distinct terms in the query's own order: a cut must not depend on spelling.
        let mut seen = std::collections::HashSet::new();
        let query_terms: Vec<String> = terms(query)
            .into_iter()
            .filter(|t| seen.insert(t.clone()))
            .take(QUERY_TERMS_MAX)
            .collect();
        let n = self.lengths.len() as f32;
        let mut touched: Vec<u32> = Vec::new();
        for term in &query_terms {
            let Some(postings) = self.postings.get(term) else {
                continue;
            };
            let df = postings.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for posting in postings {
                let lengths = &self.lengths[posting.doc as usize];
                let mut tf = 0.0;
                for field in 0..FIELDS {
                    if posting.tf[field] == 0 {
                        continue;
                    }
                    let norm = 1.0 - FIELD_B[field]
                        + FIELD_B[field] * lengths[field] as f32 / self.average[field];
                    tf += FIELD_WEIGHTS[field] * f32::from(posting.tf[field]) / norm;
                }
                let slot = &mut scores[posting.doc as usize];
                if *slot == 0.0 {
                    touched.push(posting.doc);
                }
                *slot += idf * tf / (K1 + tf);
            }
        }
        touched
            .into_iter()
            .map(|doc| {
                let score = std::mem::take(&mut scores[doc as usize]);
                (doc, score)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str, description: &str) -> ToolDocument {
        ToolDocument {
            name: name.into(),
            description: description.into(),
            ..ToolDocument::default()
        }
    }

    #[test]
    fn names_split_at_case_changes_separators_and_digits() {
        assert_eq!(terms("getWeather"), ["get", "weather"]);
        assert_eq!(
            terms("math.factorial"),
            ["math".to_string(), stem("factorial")]
        );
        assert_eq!(terms("fx__read_file"), ["fx", "read", "file"]);
        assert_eq!(
            terms("sha256sum"),
            ["sha", "sum"],
            "a number is a value, not a word"
        );
    }

    #[test]
    fn word_forms_meet_at_one_term() {
        for w in [
            "calculate",
            "calculates",
            "calculated",
            "calculating",
            "calculation",
        ] {
            assert_eq!(stem(w), stem("calculate"), "{w}");
        }
        assert_eq!(stem("triangles"), stem("triangle"));
        assert_eq!(stem("cities"), stem("city"));
        assert_eq!(stem("invented"), stem("invention"));
        assert_eq!(stem("genetically"), stem("genetics"));
    }

    #[test]
    fn a_term_in_the_name_outranks_the_same_term_in_a_description() {
        let index = Bm25Index::build(&[
            doc(
                "list_dir",
                "Lists the entries of a directory, weather permitting",
            ),
            doc("get_weather", "Current conditions of a city"),
        ]);
        let mut scratch = Vec::new();
        let mut ranked = index.rank("weather", &mut scratch);
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        assert_eq!(ranked[0].0, 1, "{ranked:?}");
        assert!(scratch.iter().all(|s| *s == 0.0), "scratch left zeroed");
    }

    #[test]
    fn a_long_request_keeps_its_last_words() {
        let index = Bm25Index::build(&[doc("get_weather", "Current conditions of a city")]);
        // A hundred distinct words that spell before "weather", then "weather".
        let words: Vec<String> = (0..100u8)
            .map(|i| format!("a{}{}", (b'a' + i / 26) as char, (b'a' + i % 26) as char))
            .collect();
        let query = format!("{} weather", words.join(" "));
        assert_eq!(index.rank(&query, &mut Vec::new()).len(), 1, "{query}");
    }

    #[test]
    fn a_query_of_stop_words_matches_nothing() {
        let index = Bm25Index::build(&[doc("read_file", "Reads a file")]);
        assert!(index.rank("the of and", &mut Vec::new()).is_empty());
    }
}
