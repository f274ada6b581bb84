//! Wording shared by the library's messages in every binding (no other module's
//! types): a type or class name with its indefinite article.

/// `noun` with its indefinite article, for messages that name a type or class the host
/// gave (`an OpenStruct`, `an Integer`, `a Time`, `an int`, `a str`): "an" before a
/// vowel letter (a, e, i, o, u, either case), "a" otherwise (an empty noun too). Chosen
/// by the first letter, not its sound, which only a dictionary knows (`a User`,
/// `an Uuid`): names are shown as the host spells them.
pub fn with_article(noun: &str) -> String {
    let vowel = noun
        .chars()
        .next()
        .is_some_and(|c| matches!(c.to_ascii_lowercase(), 'a' | 'e' | 'i' | 'o' | 'u'));
    format!("{} {noun}", if vowel { "an" } else { "a" })
}

#[cfg(test)]
mod tests {
    use super::with_article;

    #[test]
    fn an_before_a_vowel_letter_a_otherwise() {
        for (noun, shown) in [
            ("OpenStruct", "an OpenStruct"),
            ("Integer", "an Integer"),
            ("int", "an int"),
            ("Array", "an Array"),
            ("Exception", "an Exception"),
            ("Time", "a Time"),
            ("str", "a str"),
            ("BigDecimal", "a BigDecimal"),
            ("", "a "),
        ] {
            assert_eq!(with_article(noun), shown);
        }
    }
}
