//! Publish/subscribe. Not built yet: refused.
