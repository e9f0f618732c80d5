//! Test certificates: [`Pki`] is a CA that issues server and client certificates (valid or
//! expired) as PEM files in a scratch directory, made fresh per test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8).
    pub key: PathBuf,
}

/// A test CA and the directory its files are written to (removed on drop).
pub struct Pki {
    dir: PathBuf,
    name: String,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

impl Pki {
    /// A new CA named `name`; its certificate is at [`Pki::ca`].
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "respway-pki-{name}-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("respway test CA {name}"));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        let ca = CertifiedIssuer::self_signed(p, key).expect("ca cert");
        let pki = Pki {
            dir,
            name: name.to_owned(),
            ca,
        };
        write(&pki.ca(), &pki.ca.pem());
        pki
    }

    /// The CA certificate (PEM file).
    pub fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A certificate for `names` (DNS names or IP addresses, the first also the CN), usable by
    /// servers and clients, written as `<stem>.pem` and `<stem>.key`. `expired`: its validity
    /// ended in 2001.
    pub fn issue(&self, stem: &str, names: &[&str], expired: bool) -> CertFiles {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        for n in names {
            let san = match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("dns name")),
            };
            p.subject_alt_names.push(san);
        }
        if let Some(first) = names.first() {
            p.distinguished_name.push(DnType::CommonName, *first);
        }
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.ca).expect("sign");
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
        };
        write(&files.cert, &cert.pem());
        write(&files.key, &key.serialize_pem());
        files
    }
}
