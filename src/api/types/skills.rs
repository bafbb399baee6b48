//! Skill versions (`/v1/skills/**`, beta `skills-2025-10-02`).

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// `skill_version`: one immutable upload of a skill.
///
/// With the `skills-2025-10-02` beta, `id` is the version's Unix timestamp in
/// microseconds (`"1759178010641129"`): the value that addresses it in paths,
/// and what an alias such as `latest` resolves to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillVersion {
    #[serde(rename = "type", default = "tag_skill_version")]
    pub object_type: String,
    pub id: String,
    pub skill_id: String,
    /// The skill's kebab-case slug, also the top-level directory of its
    /// files. It comes from the server and is not trusted as a path.
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub created_at: Timestamp,
}

fn tag_skill_version() -> String {
    "skill_version".into()
}

/// Query of `GET /v1/skills/{skill_id}/versions`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListSkillVersions {
    /// 1 to 1000; the API's default is 20.
    pub limit: Option<u32>,
    pub page: Option<String>,
}
