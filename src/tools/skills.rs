//! The session agent's skills, downloaded into `<workdir>/skills/<name>/`.
