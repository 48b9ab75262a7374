"""CI generation: the GitHub Actions workflow (``.github/workflows/images.yml``) and the GitLab pipeline
(``ci/gitlab/images.gitlab-ci.yml``), whose jobs come from ``ascendkit plan --ci`` when they run."""
