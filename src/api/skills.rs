//! Skill endpoints the worker uses (beta `skills-2025-10-02`): resolve a
//! version, list versions, download a version's files.
//!
//! The download is written to a file as it arrives rather than buffered: a
//! skill bundle may be hundreds of megabytes, and the caller unpacks it from
//! disk anyway.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use tokio::io::AsyncWriteExt;

use super::client::{ApiFamily, Client, Query};
use super::error::Error;
use super::seg;
use super::types::{ListSkillVersions, Page, SkillVersion};

/// `/v1/skills`.
pub struct Skills<'a> {
    client: &'a Client,
}

/// Why a download did not land on disk whole.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The request failed, or the API answered with an error.
    #[error(transparent)]
    Api(#[from] Error),
    /// The content could not be written where it was asked to go.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The content is larger than the caller accepts.
    #[error("the content is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    /// No data arrived for this long.
    #[error("the download stalled: no data for {0:?}")]
    Stalled(Duration),
}

impl Client {
    pub fn skills(&self) -> Skills<'_> {
        Skills { client: self }
    }
}

fn require(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        Err(Error::Config(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}

impl Skills<'_> {
    fn versions(skill_id: &str) -> String {
        format!("/v1/skills/{}/versions", seg(skill_id))
    }

    fn version(skill_id: &str, version: &str) -> String {
        format!("{}/{}", Self::versions(skill_id), seg(version))
    }

    /// `GET /v1/skills/{skill_id}/versions/{version}`. `version` is a version
    /// id or the alias `latest`, which the API resolves: the answer's `id` is
    /// the concrete version to download.
    pub async fn retrieve_version(
        &self,
        skill_id: &str,
        version: &str,
    ) -> Result<SkillVersion, Error> {
        require("skill_id", skill_id)?;
        require("version", version)?;
        let rb = self.client.request(
            Method::GET,
            ApiFamily::Skills,
            &Self::version(skill_id, version),
        );
        self.client.json(rb).await
    }

    /// `GET /v1/skills/{skill_id}/versions`, newest first.
    pub async fn list_versions(
        &self,
        skill_id: &str,
        params: &ListSkillVersions,
    ) -> Result<Page<SkillVersion>, Error> {
        require("skill_id", skill_id)?;
        let query = Query::default()
            .opt("limit", params.limit)
            .opt("page", params.page.as_deref());
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Skills, &Self::versions(skill_id))
            .query(query.pairs());
        self.client.json(rb).await
    }

    /// `GET /v1/skills/{skill_id}/versions/{version}/content`, streamed into
    /// `path` (created or truncated); returns the bytes written. `version`
    /// must be a concrete version id, not an alias.
    ///
    /// A body over `max_bytes` is refused (by its `content-length` up front,
    /// else once that many bytes have arrived), and so is a body that goes
    /// silent for the client's request timeout. The whole transfer has no
    /// overall bound: a large bundle on a slow link still arrives. On error
    /// `path` may hold a partial download; the caller owns its removal.
    pub async fn download_version(
        &self,
        skill_id: &str,
        version: &str,
        path: &Path,
        max_bytes: u64,
    ) -> Result<u64, DownloadError> {
        require("skill_id", skill_id)?;
        require("version", version)?;
        let idle = self.client.request_timeout();
        let rb = self
            .client
            .unbounded_request(
                Method::GET,
                ApiFamily::Skills,
                &format!("{}/content", Self::version(skill_id, version)),
            )
            .header(reqwest::header::ACCEPT, "application/binary");
        let mut response = tokio::time::timeout(idle, self.client.execute(rb))
            .await
            .map_err(|_| DownloadError::Stalled(idle))??;
        if response.content_length().is_some_and(|n| n > max_bytes) {
            return Err(DownloadError::TooLarge { limit: max_bytes });
        }
        let write_error = |source| DownloadError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::create(path).await.map_err(write_error)?;
        let mut written: u64 = 0;
        loop {
            let chunk = tokio::time::timeout(idle, response.chunk())
                .await
                .map_err(|_| DownloadError::Stalled(idle))?
                .map_err(Error::Transport)?;
            let Some(chunk) = chunk else { break };
            written += chunk.len() as u64;
            if written > max_bytes {
                return Err(DownloadError::TooLarge { limit: max_bytes });
            }
            file.write_all(&chunk).await.map_err(write_error)?;
        }
        // A tokio file finishes its last write in the background; flush so
        // the bytes are on disk before anyone reads the path.
        file.flush().await.map_err(write_error)?;
        Ok(written)
    }
}
